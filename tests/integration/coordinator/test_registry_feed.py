"""The agent registry is soft state in the servers' memory (bus/agents.py): a single nats-server
that restarts forgets the bucket, configuration and all. The coordinator's feed of it
(registry_feed.py) makes it again and watches the new one; the ranks are heard again at their
next heartbeat, as news (not as a dead rank's stored last word)."""

from __future__ import annotations

import asyncio

import nats.errors
import pytest
from nats.js import api

from powerguard.bus import Bus, BusNames, EmbeddedNats
from powerguard.coordinator.registry_feed import RegistryFeed
from powerguard.schemas import AgentData
from powerguard.sim.agents import SimulatedRanks

from .helpers import JOBS, eventually

pytestmark = pytest.mark.integration


async def test_a_restarted_single_server_forgets_the_registry_and_the_leader_makes_and_watches_it_again(tmp_path):
    server = EmbeddedNats(store_dir=tmp_path / "nats").start()
    names = BusNames.isolated()
    buses: list[Bus] = []
    heard: list[tuple[str, bool, int]] = []  # (key, stored, incarnation the feed was on)
    try:
        admin = await Bus.connect(server.url, service="admin", names=names)
        buses.append(admin)
        info = await admin.js.stream_info(f"KV_{names.agents}")
        assert info.config.storage == api.StorageType.MEMORY  # off the fsync path
        ranks_bus = await Bus.connect(server.url, service="sim", names=names, setup=False)
        coord = await Bus.connect(server.url, service="coordinator", names=names, setup=False)
        buses += [ranks_bus, coord]
        ranks = SimulatedRanks(ranks_bus, JOBS, heartbeat_s=0.5)
        await ranks.start()
        restarts = [0]
        feed = RegistryFeed(coord, lambda agent, key, at, stored: heard.append((key, stored, restarts[0])))
        await feed.start(0.0)
        all_keys = {f"{j}.{n}.{r}" for j, nodes in JOBS.items() for r, n in enumerate(nodes)}
        await eventually(lambda: {k for k, stored, _ in heard if not stored} == all_keys, 20, "every rank heard")
        assert not await feed.check(100.0)  # the same bucket: nothing to do
        # a bucket that lived a while: its sequence far ahead of what the new one reaches soon (a
        # watch of the lost bucket, resuming where it was, would wait for the new one to catch up)
        kv = await ranks_bus.agents()
        record = AgentData(job="j1", rank=0, world_size=4, node="n1", step=80)
        for _ in range(20):
            await asyncio.gather(*(kv.put("j1.n1.0", record) for _ in range(200)))

        server.stop()
        server.start()  # same port, same store dir: the file streams are back, the memory bucket is not
        restarts[0] = 1
        checked = [100.0]

        async def replaced() -> bool:
            checked[0] += 5.0
            try:
                return await feed.check(checked[0])
            except (nats.errors.Error, TimeoutError):  # not reconnected yet: the service's loop tries again
                return False

        await eventually(replaced, 30, "the feed to make the bucket again and watch it", every=0.2)
        info = await admin.js.stream_info(f"KV_{names.agents}")
        assert info.config.storage == api.StorageType.MEMORY and info.config.max_age == 30.0
        # every rank heard again from the new bucket, each as news (written since the loss)
        await eventually(
            lambda: {k for k, stored, n in heard if n == 1 and not stored} == all_keys,
            30,
            "every rank heard again after the restart",
            details=lambda: str(heard[-5:]),
        )
        assert not [k for k, stored, n in heard if n == 1 and stored]
        await feed.stop()
        await ranks.stop()
    finally:
        for bus in buses:
            await bus.close()
        server.cleanup()
