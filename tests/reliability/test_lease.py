"""A leader that stalled past its lease (a GC pause, a slow KV) while another replica took
over must not store or publish anything for the batch in hand: it steps down."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time

import pytest

from powerguard.coordinator.service import Coordinator
from powerguard.sim.agents import SimulatedRanks
from tests.integration.coordinator.helpers import JOBS, eventually, outage, policy, site

pytestmark = pytest.mark.integration


async def test_a_leader_whose_lease_lapsed_publishes_nothing_and_steps_down(make_bus, caplog):
    caplog.set_level(logging.INFO, logger="powerguard.coordinator.service")  # before anything it logs
    bus, sim, obs = await make_bus("coordinator"), await make_bus("sim"), await make_bus("observer")
    ranks = SimulatedRanks(sim, JOBS, step=50)
    await ranks.start()
    coordinator = Coordinator(bus, site(), policy=policy().model_copy(update={"lease_ttl_s": 30.0}), instance="c1")
    stop = asyncio.Event()
    task = asyncio.create_task(coordinator.run(stop))
    try:
        await eventually(lambda: coordinator.leader, 20, "leadership")
        # the stall: c1's lease runs out, and replica c2 takes the site over in the meantime
        coordinator.lease.lapse()
        leases = await bus.leases()
        entry = await leases.get(coordinator.lease.key)
        taken = json.dumps({"holder": "c2", "expires": time.time() + 60}).encode()
        await leases.update(coordinator.lease.key, taken, revision=entry.revision)
        await outage(sim)
        await eventually(lambda: not coordinator.leader, 10, "c1 to step down")
        assert "stops leading (lease expired while handling a batch)" in caplog.text  # the outage's batch did it
        # it stepped down handling the outage's batch: what it would have published is stored by now
        for job in JOBS:
            assert await obs.last(obs.subjects.ckpt_request(job)) is None, f"c1 asked {job} for a checkpoint"
        assert coordinator.revisions == {}, "c1 stored a saga without the lease"
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 10)
        await ranks.stop()
