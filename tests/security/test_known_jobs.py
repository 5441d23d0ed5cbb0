"""The management host loses power (the broker forgets its memory-stored agent registry) and the
coordinator restarts: a job whose ranks are off the bus, or not yet back in the registry, is
still known. Before: the registry was the only record of the jobs, so the restarted coordinator
dropped the job's gauges (``PowerGuardAgentsMissing`` resolved while its ranks were still
refused) and an outage opened a saga with no job, powering the job's node off unasked."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import REGISTRY

from powerguard.bus.agents import announce
from powerguard.coordinator import metrics
from powerguard.schemas import AgentData, AgentRegistered, CheckpointRequested

from .conftest import SITE, eventually
from .services import coordinator, outage

pytestmark = pytest.mark.timeout(180)


def gauge(name: str, job: str) -> float | None:
    return REGISTRY.get_sample_value(name, {"training_job": job})


async def test_a_job_the_broker_forgot_keeps_its_alert_and_its_checkpoint_request_after_a_restart(deployment):
    dep = deployment
    job = await dep.connect("agent", job="jobB")
    ups = await dep.connect("ups-monitor")
    admin = await dep.connect("admin", service="admin-check")
    requests: list[CheckpointRequested] = []
    sub = await job.listen(CheckpointRequested, subject=job.subjects.ckpt_request("jobB")).start()

    async def follow() -> None:
        async for ev in sub:
            requests.append(ev)

    follower = asyncio.create_task(follow())
    try:
        async with coordinator(dep) as c:
            await announce(job, AgentRegistered(data=AgentData(job="jobB", rank=0, world_size=2, node="n2")))
            sagas = await admin.kv(dep.names.sagas)
            await eventually(lambda: "jobB" in c.book.jobs, 15, "the coordinator to hear jobB")
            key = f"job.{SITE}.jobB"

            async def stored() -> bool:
                return await sagas.get(key) is not None

            await eventually(stored, 15, "jobB's entry stored in the coordinator's bucket")
        # the broker restarted and forgot the memory-stored registry; the coordinator is a new
        # process (no series of its own yet); jobB's ranks are off the bus (revoked, or not back)
        await admin.js.delete_stream(f"KV_{dep.names.agents}")
        for g in (metrics.JOB_RANKS_HEARD, metrics.JOB_WORLD_SIZE, metrics.JOB_LAST_HEARD):
            g.clear()
        async with coordinator(dep) as c:
            await eventually(
                lambda: gauge("powerguard_job_world_size", "jobB") == 2, 15, "jobB's world size exported again"
            )
            assert gauge("powerguard_job_ranks_registered", "jobB") == 0  # the alert's expression holds: 0 < 2
            await outage(ups)
            await eventually(lambda: requests, 15, "jobB's checkpoint request")
            (rec,) = c.open.values()
            assert set(rec.jobs) == {"jobB"} and set(rec.jobs["jobB"].ranks.values()) == {"n2"}
    finally:
        follower.cancel()
