"""A framework's save still writing at the request's deadline: the rank answers ``ckpt.failed``
with the reason at the deadline, not when (or if) the framework's write ends; a save that ends in
time is acked ``durable``. An in-process agent (one rank) in framework mode on a real nats-server."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from powerguard.ckpt_agent import CheckpointAgent
from powerguard.schemas import CheckpointDurable, CheckpointFailed

from .test_agent import answers, registered, request

pytestmark = pytest.mark.integration


async def _due(agent: CheckpointAgent, step: int = 0, timeout: float = 20.0) -> int:
    """Step the agent (as the framework's callback does) from ``step`` on until a request is
    due; the step. (A one-rank job: before this test it never acted on a request at all.)"""
    t0 = time.monotonic()
    while agent.due is None:
        assert time.monotonic() - t0 < timeout, "the request never became due"
        step += 1
        await asyncio.to_thread(agent.step, step)
        await asyncio.sleep(0.02)
    return agent.due.step


async def test_a_framework_save_past_the_deadline_answers_failed_at_the_deadline(bus, nats_server, tmp_path):
    agent = CheckpointAgent(
        job="jdl",
        model=torch.nn.Linear(2, 2),
        local_dir=tmp_path,
        nats_url=nats_server.url,
        names=bus.names,
        framework="hf",
        agree_every_s=0,
    )
    failed = bus.subscribe(CheckpointFailed, deliver="all")
    durable = bus.subscribe(CheckpointDurable, deliver="all")
    await failed.start()
    await durable.start()
    try:
        await registered(bus, "jdl", 10, frozenset({0}))  # it listens for requests before it registers
        await request(bus, "jdl", deadline_s=3.0, rid="late")
        step = await _due(agent)
        t_due = time.time()
        (ans,) = await answers(failed, 1, timeout=10)  # the framework is "still writing"
        assert ans.data.request_id == "late" and "not durable by the request's deadline" in ans.data.error
        assert time.time() - t_due < 4.0  # at the deadline, not after the write
        directory = tmp_path / f"checkpoint-{step}"
        directory.mkdir()
        (directory / "model.safetensors").write_bytes(b"w" * 100)
        saved = await asyncio.to_thread(agent.finish_due, directory)
        assert saved is not None and (directory / "COMMIT").exists()  # committed all the same: a resume may use it

        await request(bus, "jdl", deadline_s=30.0, rid="in-time")
        step = await _due(agent, step)
        directory = tmp_path / f"checkpoint-{step}"
        directory.mkdir()
        (directory / "model.safetensors").write_bytes(b"v" * 100)
        await asyncio.to_thread(agent.finish_due, directory)
        (ok,) = await answers(durable, 1, timeout=10)
        # the first durable ack on the stream: none for "late" came before it (one answer per request)
        assert ok.data.request_id == "in-time" and ok.data.step == step
    finally:
        await asyncio.to_thread(agent.close)
        await failed.aclose()
        await durable.aclose()
