"""A 3-node NATS JetStream cluster on loopback (R3 stream and KV buckets) loses the node that
leads the event stream in the middle of a saga: the saga completes and no event is lost."""

from __future__ import annotations

import asyncio
import contextlib
import signal

import pytest

from powerguard.bus import BusNames
from powerguard.coordinator.service import Coordinator
from powerguard.schemas import Envelope
from powerguard.sim.agents import SimulatedRanks
from powerguard.sim.executor import SimulatedPowerControl
from tests.integration.nats_cluster import connect, nats_cluster
from tests.waiting import eventually

from .helpers import JOBS, SagaWatch, drain_battery, outage, policy, power_back, site

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


@pytest.fixture
def cluster(tmp_path):
    with nats_cluster(tmp_path) as nodes:
        yield nodes


async def test_saga_survives_the_loss_of_the_stream_leader(cluster):
    names = BusNames.isolated()
    bus = await connect(cluster, "coordinator", names)
    sim_bus, ctl_bus, obs_bus = [await connect(cluster, n, names) for n in ("sim", "pc", "observer")]
    info = await bus.js.stream_info(names.stream)
    assert info.config.num_replicas == 3
    seen: dict[str, Envelope] = {}
    ranks = SimulatedRanks(sim_bus, JOBS, step=120)
    await ranks.start()
    executor = SimulatedPowerControl(ctl_bus, resume_step={"j1": 120, "j2": 120})
    await executor.start()
    watch = await SagaWatch(bus).start()
    coordinator = Coordinator(bus, site(), policy=policy().model_copy(update={"lease_ttl_s": 5.0}), instance="c1")
    stop = asyncio.Event()
    task = asyncio.create_task(coordinator.run(stop))
    published: list[str] = []
    try:
        await eventually(lambda: coordinator.leader, 20, "the coordinator to lead")
        published.append((await outage(sim_bus)).id)
        await watch.reach("holding", timeout=60)
        leader = (await bus.js.stream_info(names.stream)).cluster.leader
        victim = next(n for n in cluster if f"n{cluster.index(n)}" == leader)
        victim.proc.send_signal(signal.SIGKILL)  # the stream leader's host dies mid-saga
        victim.proc.wait()
        # the stream elects a new leader first (seconds on a loaded 2-core CI box): the publish
        # retries until it is stored, bounded well inside the saga's deadlines
        await drain_battery(sim_bus, runtime_s=40, timeout=40)
        await watch.reach("down", timeout=90)
        await power_back(sim_bus, timeout=40)
        await watch.reach("done", timeout=90)
        new_leader = (await bus.js.stream_info(names.stream)).cluster.leader
        assert new_leader and new_leader != leader

        async def caught_up() -> bool:  # every replica still up (not the killed one) holds what the leader holds
            infos = [await bus.js.stream_info(s) for s in names.streams]
            return all(p.current for i in infos for p in (i.cluster.replicas or []) if p.name != leader)

        await eventually(caught_up, 30, "the streams' live replicas to be current")
        # read the stream back from the two nodes left (a reader that lives through the node's
        # loss is tested on its own in tests/integration/test_bus_cluster.py)
        for stream, subjects in names.split([obs_bus.subjects.all]).items():  # the events', the jobs'
            last = (await obs_bus.js.stream_info(stream)).state.last_seq
            async with obs_bus.subscribe(deliver="all", subject=subjects) as reader:
                while True:
                    got = await asyncio.wait_for(reader.next_received(), 30)
                    seen[got.event.id] = got.event
                    if got.sequence >= last:
                        break
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 15)
        await executor.stop()
        await watch.stop()
        for b in (obs_bus, ctl_bus, sim_bus, bus):
            with contextlib.suppress(Exception):
                await b.close()
    assert watch.states[-3:] == ["restoring", "resumed", "done"]
    # nothing lost: the outage event, every ack and every command and result are in the stream
    assert published[0] in seen
    acks = [e for e in seen.values() if e.type.endswith("ckpt.v1.durable")]
    assert {(e.data.job, e.data.rank) for e in acks} == {(j, r) for j in JOBS for r in range(4)}
    kinds = {e.type.rsplit(".", 1)[-1] for e in seen.values()}
    assert {"shutdown_requested", "on_requested", "restart_requested"} <= kinds
    assert sorted(executor.executed) == sorted(set(executor.executed))  # every command executed once
