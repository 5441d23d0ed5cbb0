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


async def _stopped(stop: asyncio.Event, *tasks: asyncio.Task | None) -> None:
    """Stop the coordinators' runs and wait for each that started."""
    stop.set()
    for t in tasks:
        if t is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(t, 10)


async def test_a_leader_whose_tick_outlasts_the_lease_keeps_it_while_a_standby_waits(make_bus, caplog):
    """A tick slower than the lease's TTL (a cluster's stores fsyncing after a cut took 2-4 s
    here) must not hand the site to a standby: the lease is renewed beside the loop. Before
    LeaseKeeper the loop renewed between ticks and c2 took the site during c1's first slow tick."""
    caplog.set_level(logging.INFO, logger="powerguard.coordinator.service")
    quick = policy().model_copy(update={"lease_ttl_s": 1.5})
    c1 = Coordinator(await make_bus("coordinator"), site(), policy=quick, instance="c1")
    c2 = Coordinator(await make_bus("coordinator"), site(), policy=quick, instance="c2")
    stop = asyncio.Event()
    t1 = asyncio.create_task(c1.run(stop))
    t2 = None
    try:
        await eventually(lambda: c1.leader, 20, "c1 to lead")
        t2 = asyncio.create_task(c2.run(stop))
        await eventually(lambda: "ok: standby" in caplog.text, 20, "c2 to follow")
        tick, slow_ticks = c1.tick, []

        async def slow_tick() -> None:  # three ticks of 2.5 s each: each outlasts the TTL
            if len(slow_ticks) < 3:
                await asyncio.sleep(2.5)
                slow_ticks.append(time.monotonic())
            await tick()

        c1.tick = slow_tick
        # the event either way: c1's three slow ticks done, or the standby leading
        await eventually(lambda: len(slow_ticks) == 3 or c2.leader, 30, "c1's three slow ticks")
        assert c1.leader and not c2.leader, "the standby took the site during the leader's slow tick"
        assert "c2 leads site" not in caplog.text
    finally:
        await _stopped(stop, t1, t2)


async def test_a_lease_whose_owner_stopped_turning_lapses(make_bus):
    """The keeper renews only while its owner's loop turns: a wedged leader loses the site."""
    from powerguard.coordinator.lease import Lease, LeaseKeeper

    bus = await make_bus("coordinator")
    lease = Lease(await bus.leases(), key="coordinator.dc1", holder="c1", ttl_s=1.0)
    keeper = LeaseKeeper(lease, 0.2, stall_s=0.6)
    keeper.start()
    try:
        await keeper.news.wait()
        assert keeper.latest() == (True, None)  # the first round takes it
        while True:  # no beat from here on: a round finds the owner stalled and lets it lapse
            await keeper.news.wait()
            held, exc = keeper.latest()
            if not held:
                break
        assert exc is None
        await eventually(lambda: not lease.held, 5, "the lease to lapse")
        entry = await (await bus.leases()).get("coordinator.dc1")
        assert json.loads(entry.value)["expires"] < time.time()  # a standby may take it now
    finally:
        await keeper.stop()


async def test_two_coordinators_of_one_instance_name_one_leads_the_other_says_why(make_bus, caplog):
    """Two coordinator processes on one host without ``POWERGUARD_INSTANCE`` (both named after
    the host): before, the lease was the name's, and both led the site (both /readyz "ok: leads
    the site"). Now it is the process's: one leads, the other follows and names the cause."""
    caplog.set_level(logging.INFO, logger="powerguard.coordinator.service")
    a = Coordinator(await make_bus("coordinator"), site(), policy=policy(), instance="mgmt1")
    b = Coordinator(await make_bus("coordinator"), site(), policy=policy(), instance="mgmt1")
    said: list[tuple[bool, str]] = []
    stop = asyncio.Event()
    ta = asyncio.create_task(a.run(stop))
    tb = None
    try:
        await eventually(lambda: a.leader, 20, "the first to lead")
        tb = asyncio.create_task(b.run(stop, on_ready=lambda ok, why: said.append((ok, why))))
        await eventually(lambda: said, 20, "the second's first lease check")
        assert not b.leader and a.leader, "both lead the site under one name"
        assert "another coordinator process named 'mgmt1' holds the lease" in said[-1][1], said
        assert "POWERGUARD_INSTANCE" in caplog.text
    finally:
        await _stopped(stop, ta, tb)


async def test_a_lease_held_by_a_process_of_this_host_that_is_gone_is_taken_at_once(make_bus):
    """A crash and restart under the same name: the holder's pid on this host no longer runs,
    so the new process takes the lease at once instead of waiting out the TTL."""
    from powerguard.coordinator.lease import Lease

    kv = await (await make_bus("coordinator")).leases()
    old = Lease(kv, key="coordinator.dc1", holder="mgmt1", ttl_s=60.0)
    assert await old.keep()
    gone = await asyncio.create_subprocess_exec("true")  # a pid that ran on this host and ended
    await gone.wait()
    old.pid = gone.pid
    assert await old.keep()  # its record now names the ended pid, valid for another minute
    new = Lease(kv, key="coordinator.dc1", holder="mgmt1", ttl_s=60.0)
    assert await new.keep(), new.clash
    live = Lease(kv, key="coordinator.dc1", holder="mgmt1", ttl_s=60.0)  # this process: alive
    assert not await live.keep() and "holds the lease" in (live.clash or "")
