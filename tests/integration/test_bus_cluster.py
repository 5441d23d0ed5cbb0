"""The bus on a 3-node cluster when the node holding a reader's consumer dies."""

from __future__ import annotations

import asyncio
import contextlib
import signal

import pytest

from powerguard.bus import BusNames
from powerguard.schemas import OnBattery, PowerData
from tests.integration.nats_cluster import connect, nats_cluster
from tests.waiting import eventually

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def reading(i: int) -> OnBattery:
    return OnBattery(data=PowerData(site="dc1", ups="ups-a", on_battery=True, runtime_s=300.0 - i, charge_pct=90.0))


async def test_subscription_outlives_the_node_that_held_its_consumer(tmp_path):
    """An observer's ephemeral consumer lives on one server (R1). When that server dies the
    pull requests go nowhere and the server reports nothing: the reader must notice, re-create
    its consumer after the last message it saw, and miss nothing."""
    names = BusNames.isolated()
    with nats_cluster(tmp_path) as nodes:
        pub = await connect(nodes, "ups-monitor", names)
        obs = await connect(nodes, "observer", names)
        sub = await obs.subscribe(OnBattery, deliver="all").start()
        got: list[str] = []

        async def read() -> None:
            async for ev in sub:
                got.append(ev.id)

        reader = asyncio.create_task(read())
        try:
            events = [reading(i) for i in range(6)]
            for ev in events[:3]:
                await pub.publish(ev)
            await eventually(lambda: len(got) >= 3, 10, "the first three events read")
            info = await obs.js.consumer_info(names.stream, sub.name)
            host = next(n for i, n in enumerate(nodes) if f"n{i}" == info.cluster.leader)
            host.proc.send_signal(signal.SIGKILL)
            host.proc.wait()
            for ev in events[3:]:  # stored once the stream elected a new leader among the two left

                async def stored(ev=ev) -> bool:
                    try:
                        await pub.publish(ev, timeout=2)
                        return True
                    except Exception:  # no leader yet: not stored
                        return False

                await eventually(stored, 60, f"event {ev.id} stored after the leader's loss", every=0.5)
            first, later = [e.id for e in events[:3]], [e.id for e in events[3:]]
            await eventually(lambda: set(later) <= set(got), 30, "the reader to read on past the node's loss")
        finally:
            reader.cancel()
            with contextlib.suppress(BaseException):
                await reader
            for b in (pub, obs):
                with contextlib.suppress(Exception):
                    await b.close()
    assert set(first) <= set(got), "the reader never read the first events"
    assert set(later) <= set(got), f"the reader stalled after its consumer's server died: {len(got)} of 6"
    assert len(got) == len(set(got)), "a re-created consumer replayed what was already read"
