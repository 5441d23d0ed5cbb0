"""The PowerGuard Lightning callback in a real 2-rank DDP job (torchrun, gloo) against a real
nats-server: a power request checkpoints one step through Lightning, the job dies right after the
ack, and the restart resumes from it to the same final weights as an uninterrupted run."""

from __future__ import annotations

import asyncio
import json

import pytest

from powerguard.schemas import CheckpointFailed
from tests.conftest import require_module

from .frameworks import checkpoint_then_kill, resume_matches
from .runner import Trainer, run
from .test_agent import answers, registered, request

require_module("pytorch_lightning", "lightning")
pytestmark = pytest.mark.integration
MODULE = "powerguard.sim.train_lightning"
STEPS = 60


async def test_lightning_request_acks_one_step_and_the_restart_resumes_bit_exact(bus, nats_server, tmp_path):
    reference = tmp_path / "a.pt"
    await run(tmp_path / "A", "jlight", module=MODULE, steps=STEPS, out=reference, local_dir=tmp_path / "A" / "ckpt")
    b_dir = tmp_path / "B"
    b_dir.mkdir()
    opts = {"module": MODULE, "local_dir": b_dir / "ckpt", "steps": STEPS}
    step = await checkpoint_then_kill(bus, nats_server, b_dir, "jlight", after_steps=20, **opts)
    assert 0 < step < STEPS
    directory = b_dir / "ckpt" / "jlight" / f"step-{step}"
    commit = json.loads((directory / "COMMIT").read_text())
    assert commit["framework"] == "lightning" and commit["world_size"] == 2 and commit["saga_id"] == "saga-t"
    assert (directory / "checkpoint.ckpt").is_file()
    out = tmp_path / "b.pt"
    output = await resume_matches(bus, nats_server, b_dir, "jlight", step=step, reference=reference, out=out, **opts)
    assert f"step-{step}/checkpoint.ckpt" in output  # Lightning restored from it
    assert "RNG state restored" in output


async def test_the_docs_loader_is_sharded_and_a_dropout_model_resumes_exactly_without_generators(
    bus, nats_server, tmp_path
):
    """The loader as docs/frameworks/lightning.md builds it (a plain shuffled DataLoader, no
    generator, in ResumableLoader; Lightning's distributed sampler on). Before: the wrapper kept
    Lightning from giving it its DistributedSampler (every rank trained on all 512 samples: 32
    batches an epoch instead of 16), and the RNG was restored before Lightning drew its loaders'
    base seeds from it, so the dropout model's resume differed in 67 of 70 entries."""
    opts = {"module": MODULE, "steps": STEPS, "docs_loader": True}
    ref = await run(tmp_path / "A", "jdocs", out=tmp_path / "a.pt", local_dir=tmp_path / "A" / "ckpt", **opts)
    assert "rank 0: 16 batches per epoch" in ref.output() and "rank 1: 16 batches per epoch" in ref.output()
    b_dir = tmp_path / "B"
    b_dir.mkdir()
    step = await checkpoint_then_kill(
        bus, nats_server, b_dir, "jdocs", after_steps=20, local_dir=b_dir / "ckpt", **opts
    )
    output = await resume_matches(
        bus,
        nats_server,
        b_dir,
        "jdocs",
        step=step,
        reference=tmp_path / "a.pt",
        out=tmp_path / "b.pt",
        local_dir=b_dir / "ckpt",
        **opts,
    )
    assert "RNG state restored" in output


async def test_lightning_save_that_fails_answers_ckpt_failed_and_training_goes_on(bus, nats_server, tmp_path):
    blocked = tmp_path / "ckpt"
    blocked.mkdir()
    (blocked / "jfail").write_text("a file where the job's checkpoint directory should be")
    failed = bus.subscribe(CheckpointFailed, deliver="all")
    await failed.start()
    progress = tmp_path / "progress"
    t = await Trainer(
        tmp_path,
        "jfail",
        nats_url=nats_server.url,
        names=bus.names,
        module=MODULE,
        local_dir=blocked,
        steps=40,
        step_sleep=0.05,
        progress=progress,
    ).start()
    try:
        await registered(bus, "jfail", timeout=90)
        while not progress.exists() or len(progress.read_text().splitlines()) < 10:
            await asyncio.sleep(0.05)
        await request(bus, "jfail")
        got = await answers(failed, 2, timeout=90)
        code = await t.wait(120)
    finally:
        await t.kill()
        await failed.aclose()
    assert {a.data.rank for a in got} == {0, 1}
    assert all("cannot prepare" in a.data.error for a in got), [a.data.error for a in got]
    assert code == 0, t.output()[-3000:]  # the failure never reached Lightning's loop
    steps = [int(line.split()[1]) for line in progress.read_text().splitlines()]
    assert max(steps) == 40  # trained to the end after the failed checkpoint
