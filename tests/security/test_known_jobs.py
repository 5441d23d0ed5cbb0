"""The management host loses power (the broker forgets its memory-stored agent registry) and the
coordinator restarts: a job whose ranks are off the bus, or not yet back in the registry, is
still known. Before: the registry was the only record of the jobs, so the restarted coordinator
dropped the job's gauges (``PowerGuardAgentsMissing`` resolved while its ranks were still
refused) and an outage opened a saga with no job, powering the job's node off unasked."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from powerguard.bus import RegistrationRefused
from powerguard.bus.agents import announce
from powerguard.coordinator import metrics
from powerguard.schemas import AgentData, AgentRegistered, CheckpointRequested

from .conftest import SITE, eventually
from .services import collected, coordinator, outage

pytestmark = pytest.mark.timeout(180)


def gauge(name: str, job: str) -> float | None:
    return REGISTRY.get_sample_value(name, {"training_job": job})


async def test_a_job_the_broker_forgot_keeps_its_alert_and_its_checkpoint_request_after_a_restart(deployment):
    dep = deployment
    job = await dep.connect("agent", job="jobB")
    ups = await dep.connect("ups-monitor")
    admin = await dep.connect("admin", service="admin-check")
    async with collected(job, CheckpointRequested, job.subjects.ckpt_request("jobB"), stored=False) as requests:
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


async def test_a_job_that_fills_the_registry_leaves_another_job_protected(deployment):
    """Before: jobA wrote values under its own keys until the shared ``pg_agents`` bucket reached
    its bound; jobB, started afterwards, had every registration refused and an outage opened a
    saga with no job, powering jobB's node off unasked. Now a refused registration goes out as an
    event on jobB's own subject, the coordinator's book hears it, and jobB is asked."""
    dep = deployment
    admin = await dep.connect("admin", service="admin-check")
    stream = f"KV_{dep.names.agents}"
    info = await admin.js.stream_info(stream)
    info.config.max_bytes = 64 * 1024  # the bound, small: the same refusal in a moment, not 26 s
    await admin.js.update_stream(info.config)
    job_a = await dep.connect("agent", job="jobA")
    job_b = await dep.connect("agent", job="jobB")
    ups = await dep.connect("ups-monitor")
    async with collected(job_b, CheckpointRequested, job_b.subjects.ckpt_request("jobB"), stored=False) as requests:
        async with coordinator(dep) as c:
            kv = await job_a.agents()
            rank = 0
            for size in (4000, 400, 40, 1):  # large values, then small ones to use the slack
                with pytest.raises(Exception):  # noqa: B017  (the server's refusal, whatever nats.py calls it)
                    while rank < 100_000:
                        rank += 1
                        await kv.put(f"jobA.n1.{rank}", b"x" * size)
            with pytest.raises(RegistrationRefused):
                await announce(job_b, AgentRegistered(data=AgentData(job="jobB", rank=0, world_size=1, node="n2")))
            await eventually(lambda: "jobB" in c.book.jobs, 15, "the coordinator's book to hear jobB")
            await outage(ups)
            await eventually(lambda: requests, 15, "jobB's checkpoint request")
            (rec,) = c.open.values()
            assert "jobB" in rec.jobs
