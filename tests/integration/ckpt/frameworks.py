"""A power request to a framework's training job (torchrun, 2 ranks), the job killed right after
the acks, and what the checkpoint directory holds: shared by the Lightning and Trainer tests."""

from __future__ import annotations

import asyncio
from pathlib import Path

from powerguard.schemas import CheckpointDurable, JobResumed

from .runner import Trainer, run
from .test_agent import answers, equal_params, registered, request


async def checkpoint_then_kill(bus, nats_server, workdir: Path, job: str, *, after_steps: int, **opts) -> int:
    """Start the job, send one checkpoint request after ``after_steps`` steps, SIGKILL every
    process right after both ranks' acks; return the one step both acked."""
    acks = bus.subscribe(CheckpointDurable, deliver="all")
    await acks.start()
    progress = workdir / "progress"
    t = await Trainer(
        workdir, job, nats_url=nats_server.url, names=bus.names, step_sleep=0.05, progress=progress, **opts
    ).start()
    try:
        await registered(bus, job, timeout=90)
        while not progress.exists() or len(progress.read_text().splitlines()) < 2 * after_steps:
            await asyncio.sleep(0.05)
        await request(bus, job)
        got = await answers(acks, 2, timeout=90)
    finally:
        await t.kill()  # every process dies right after the ack: a power cut, as far as they can tell
        await acks.aclose()
    assert {a.data.rank for a in got} == {0, 1}
    (step,) = {a.data.step for a in got}  # one agreed step on every rank
    assert all(a.data.saga_id == "saga-t" and a.data.durations.total_s >= 0 for a in got)
    return step


async def resume_matches(bus, nats_server, workdir: Path, job: str, *, step: int, reference: Path, out: Path, **opts):
    """Restart the killed job: it announces ``job.resumed`` naming the acked step and its saga,
    and ends with the uninterrupted run's weights (``reference``); returns its output."""
    resumed = bus.subscribe(JobResumed, deliver="new")
    await resumed.start()
    try:
        t = await run(workdir, job, out=out, nats_url=nats_server.url, names=bus.names, **opts)
        (announced,) = await answers(resumed, 1)
    finally:
        await resumed.aclose()
    assert announced.data.step == step and announced.data.saga_id == "saga-t"  # names what it restored
    assert equal_params(reference, out), "the resumed run must end with the uninterrupted run's weights"
    return t.output()
