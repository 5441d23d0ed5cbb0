"""Threat: a job's agent writes, under the keys the server lets it write (``pg_agents`` keys
``<its job>.*``), records that claim another job (its name, its world size, its nodes). The
coordinator must file a record only as what its key says, dead-letter the rest with the reason,
and still protect the real job: every rank of it asked to checkpoint before its nodes go off."""

from __future__ import annotations

from powerguard.schemas import AgentData, AgentRegistered, CheckpointRequested
from powerguard.sim.agents import SimulatedRanks

from .conftest import eventually
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
        ("jobA.0", AgentData(job="jobB", rank=0, world_size=2**20, node="n2", step=999)),
        ("jobA.1", AgentData(job="jobB", rank=1, world_size=2, node="n2", step=999, hold_policy="continue")),
    ]
    try:
        async with (
            collected(victim, CheckpointRequested, victim.subjects.ckpt_request("jobB")) as requests,
            coordinator(dep) as c,
        ):
            for key, data in forged:
                await kv.put(key, data)
            await eventually(lambda: len(watch.dead) >= 2, 15, "the forged records dead-lettered")
            reasons = [d.data.error for d in watch.dead]
            assert all(r.startswith("IdentityMismatch") or "claims job 'jobB'" in r for r in reasons), reasons
            assert any("under key jobA.0 claims job 'jobB' rank 0" in r for r in reasons), reasons
            jobs = c.registry.jobs()
            assert jobs["jobB"].world_size == 2 and jobs["jobB"].ranks == {0: "n1", 1: "n2"}
            assert jobs["jobB"].hold_policy is None and "jobA" not in jobs
            # the legitimate path: an outage asks both of jobB's real ranks, then shuts down
            ups = await dep.connect("ups-monitor")
            await outage(ups)
            await eventually(lambda: requests, 15, "jobB's checkpoint request")
            await eventually(lambda: ranks.acked["jobB"] == {0, 1}, 15, "both of jobB's ranks acked")
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
        await kv.put("jobB.0", AgentData(job="jobB", rank=0, world_size=2, node="n1"))
        await kv.put("jobB.1", AgentData(job="jobB", rank=1, world_size=2**20, node="n2", hold_policy="continue"))
        await job.publish(AgentRegistered(data=AgentData(job="jobB", rank=1, world_size=2, node="n2")))
        await eventually(lambda: len(c.registry) == 2, 15, "both records")
        info = c.registry.jobs()["jobB"]
        assert info.world_size == 2 and info.hold_policy is None and info.ranks == {0: "n1"}
