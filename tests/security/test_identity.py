"""Threat: a job's agent writes, under the keys the server lets it write (``pg_agents`` keys
``<its job>.*``), records that claim another job (its name, its world size, its nodes). The
coordinator must file a record only as what its key says, dead-letter the rest with the reason,
and still protect the real job: every rank of it asked to checkpoint before its nodes go off."""

from __future__ import annotations

from powerguard.schemas import AgentData, AgentRegistered, CheckpointRequested
from powerguard.sim.agents import SimulatedRanks

from .conftest import eventually, refused
from .services import Watch, collected, coordinator, drain, outage


async def test_11_an_agent_record_is_filed_only_as_what_its_key_says(deployment):
    dep = deployment
    attacker = await dep.connect("agent", job="jobA")
    victim = await dep.connect("agent", job="jobB")
    observer = await dep.connect("observer")
    watch = await Watch(observer).start()
    # jobB really runs on n1 and n2 (2 ranks), with its own credential
    ranks = SimulatedRanks(victim, {"jobB": ["n1", "n2"]}, step=10)
    await ranks.start()
    # jobA, under its own keys: "jobB runs on n2 only, with 2**20 ranks" and "jobB rank 1 is on n2"
    kv = await attacker.agents()
    forged = [
        ("jobA.n2.0", AgentData(job="jobB", rank=0, world_size=2**20, node="n2", step=999)),
        ("jobA.n2.1", AgentData(job="jobB", rank=1, world_size=2, node="n2", step=999, hold_policy="continue")),
    ]
    try:
        async with (
            collected(victim, CheckpointRequested, victim.subjects.ckpt_request("jobB"), stored=False) as requests,
            coordinator(dep) as c,
        ):
            for key, data in forged:
                await kv.put(key, data)
            await eventually(lambda: len(watch.dead) >= 2, 15, "the forged records dead-lettered")
            reasons = [d.data.error for d in watch.dead]
            assert all(r.startswith("IdentityMismatch") or "claims job 'jobB'" in r for r in reasons), reasons
            assert any("under key jobA.n2.0 claims job 'jobB' node 'n2' rank 0" in r for r in reasons), reasons
            jobs = c.registry.jobs()
            assert jobs["jobB"].world_size == 2 and jobs["jobB"].ranks == {0: "n1", 1: "n2"}
            assert jobs["jobB"].hold_policy is None and "jobA" not in jobs
            # the legitimate path: an outage asks both of jobB's real ranks, then shuts down
            ups = await dep.connect("ups-monitor")
            await outage(ups)
            await eventually(lambda: requests, 15, "jobB's checkpoint request")
            await eventually(lambda: ranks.acked["jobB"] == {0, 1}, 15, "both of jobB's ranks acked")
            # the acks applied by the coordinator (sent is not applied: CI once drained the
            # battery while an ack waited out a 0.2 s retry, and the stop came first)
            await eventually(
                lambda: any(r.jobs["jobB"].complete for r in c.open.values() if "jobB" in r.jobs),
                15,
                "both of jobB's acks applied",
            )
            await drain(ups)
            await eventually(lambda: "shutting_down" in watch.states, 15, "the shutdown")
            rec = next(iter(c.open.values()))
            assert rec.jobs["jobB"].world_size == 2 and set(rec.jobs["jobB"].ranks.values()) == {"n1", "n2"}
            assert rec.jobs["jobB"].complete  # every real rank acked before the nodes were told to stop
    finally:
        watch.stop()
        await ranks.stop()


async def test_11_a_rank_cannot_change_its_jobs_world_size_or_hold_policy(deployment):
    """Within one job, job-wide fields come from rank 0's registration only."""
    dep = deployment
    job = await dep.connect("agent", job="jobB")
    async with coordinator(dep) as c:
        kv = await job.agents()
        await kv.put("jobB.n1.0", AgentData(job="jobB", rank=0, world_size=2, node="n1"))
        await kv.put("jobB.n2.1", AgentData(job="jobB", rank=1, world_size=2**20, node="n2", hold_policy="continue"))
        await job.publish(AgentRegistered(data=AgentData(job="jobB", rank=1, world_size=2, node="n2")))
        await eventually(lambda: len(c.registry) == 2, 15, "both records")
        info = c.registry.jobs()["jobB"]
        assert info.world_size == 2 and info.hold_policy is None and info.ranks == {0: "n1"}


async def test_11_a_rank_cannot_claim_a_node_its_credential_is_not_for(deployment):
    """With a node-bound credential (`creds issue agent --job jobB --node n1`, what n1's leaf
    nats-server holds), the server lets jobB's ranks on n1 write only ``jobB.n1.*``: a rank there
    cannot register as running on n3, neither under n3's key (the server refuses the put) nor
    under its own key with n3 inside (dead-lettered). Its real registration is filed on n1."""
    dep = deployment
    on_n1 = await dep.connect("agent", job="jobB", node="n1")
    observer = await dep.connect("observer")
    watch = await Watch(observer).start()
    try:
        async with coordinator(dep) as c:
            kv = await on_n1.agents()
            await refused(kv.put("jobB.n3.1", AgentData(job="jobB", rank=1, world_size=2, node="n3")))
            await kv.put("jobB.n1.1", AgentData(job="jobB", rank=1, world_size=2, node="n3"))
            await eventually(lambda: watch.dead, 15, "the record claiming n3 dead-lettered")
            assert "under key jobB.n1.1 claims job 'jobB' node 'n3' rank 1" in watch.dead[0].data.error
            await kv.put("jobB.n1.0", AgentData(job="jobB", rank=0, world_size=2, node="n1"))
            await eventually(lambda: len(c.registry) == 1, 15, "the real registration")
            assert c.registry.jobs()["jobB"].ranks == {0: "n1"}
    finally:
        watch.stop()


async def test_11_a_rank_that_moved_node_is_filed_on_its_newest_and_its_old_key_going_changes_nothing(deployment):
    dep = deployment
    job = await dep.connect("agent", job="jobB")
    async with coordinator(dep) as c:
        kv = await job.agents()
        await kv.put("jobB.n1.0", AgentData(job="jobB", rank=0, world_size=2, node="n1"))
        await eventually(lambda: "jobB" in c.registry.jobs(), 15, "rank 0 on n1")
        await kv.put("jobB.n2.0", AgentData(job="jobB", rank=0, world_size=2, node="n2"))  # restarted on n2
        await eventually(lambda: c.registry.jobs()["jobB"].ranks == {0: "n2"}, 15, "rank 0 on n2")
        await kv.delete("jobB.n1.0")  # its old key goes (or ages out)
        await kv.put("jobB.n3.1", AgentData(job="jobB", rank=1, world_size=2, node="n3"))  # seen after the delete
        await eventually(lambda: 1 in c.registry.jobs()["jobB"].ranks, 15, "rank 1")
        assert c.registry.jobs()["jobB"].ranks == {0: "n2", 1: "n3"}


async def test_11_the_console_shows_an_agent_record_only_as_what_its_key_says(deployment):
    """Before: the console (its feed skipped the coordinator's identity rule) showed jobA's
    records naming jobB on node n9 and a job payroll-train."""
    from powerguard.console import ConsoleState, Feed

    dep = deployment
    attacker = await dep.connect("agent", job="jobA")
    state = ConsoleState()
    feed = Feed(await dep.connect("observer"), state)
    await feed.start()
    try:
        kv = await attacker.agents()
        await kv.put("jobA.n1.0", AgentData(job="jobB", rank=0, world_size=2, node="n9", step=5))
        await kv.put("jobA.n1.1", AgentData(job="payroll-train", rank=1, world_size=2, node="n1", step=5))
        # jobA's own record, written last: the watch hands records over in the order they were
        # written, so once it is shown the forged ones before it were processed
        await kv.put("jobA.n1.2", AgentData(job="jobA", rank=2, world_size=3, node="n1", step=7))
        await eventually(lambda: "jobA.n1.2" in state.agents, 15, "jobA's own record on the console")
        shown = {(a.job, a.node) for a in state.agents.values()}
        assert shown == {("jobA", "n1")}, shown
        assert not any(j["name"] in ("jobB", "payroll-train") for j in state.snapshot()["jobs"])
    finally:
        await feed.stop()
