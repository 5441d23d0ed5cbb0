"""A leader that stalled past its lease (a GC pause, a slow KV) while another replica took
over must not store or publish anything for the batch in hand: it steps down."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

import pytest

from powerguard.coordinator.service import Coordinator
from powerguard.schemas import CheckpointRequested
from powerguard.sim.agents import SimulatedRanks
from tests.integration.coordinator.helpers import JOBS, eventually, outage, policy, site

pytestmark = pytest.mark.integration


async def test_a_leader_whose_lease_lapsed_publishes_nothing_and_steps_down(make_bus):
    bus, sim, obs = await make_bus("coordinator"), await make_bus("sim"), await make_bus("observer")
    requests = await obs.subscribe(CheckpointRequested, deliver="all").start()
    ranks = SimulatedRanks(sim, JOBS, step=50)
    await ranks.start()
    coordinator = Coordinator(bus, site(), policy=policy().model_copy(update={"lease_ttl_s": 30.0}), instance="c1")
    stop = asyncio.Event()
    task = asyncio.create_task(coordinator.run(stop))
    try:
        await eventually(lambda: coordinator.leader, 20, "leadership")
        # the stall: c1's lease runs out, and replica c2 takes the site over in the meantime
        coordinator._lease.expires = 0.0
        leases = await bus.leases()
        entry = await leases.get(coordinator._lease.key)
        taken = json.dumps({"holder": "c2", "expires": time.time() + 60}).encode()
        await leases.update(coordinator._lease.key, taken, revision=entry.revision)
        await outage(sim)
        await eventually(lambda: not coordinator.leader, 10, "c1 to step down")
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(requests.__anext__(), 3.0)  # no checkpoint request from c1
        assert coordinator.revisions == {}, "c1 stored a saga without the lease"
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 10)
        await requests.aclose()
        await ranks.stop()
