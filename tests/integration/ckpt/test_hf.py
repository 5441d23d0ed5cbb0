"""The PowerGuard callback in a real 2-rank Hugging Face ``Trainer`` job (a 2-layer GPT-2 built in
the job, random token ids, DDP with gloo on CPU) against a real nats-server: the request's save
happens at the agreed step, every save is committed, a corrupt newest checkpoint is skipped with
the reason, and the resume ends with the uninterrupted run's weights."""

from __future__ import annotations

import json

import pytest

from tests.conftest import require_module

from .frameworks import checkpoint_then_kill, resume_matches
from .runner import run
from .test_agent import equal_params

require_module("transformers", "hf")
pytestmark = pytest.mark.integration
MODULE = "powerguard.sim.train_hf"
STEPS = 60


async def test_trainer_request_acks_one_step_and_the_restart_resumes_bit_exact(bus, nats_server, tmp_path):
    reference = tmp_path / "a.pt"
    await run(tmp_path / "A", "jhf", module=MODULE, steps=STEPS, out=reference, local_dir=tmp_path / "A" / "out")
    b_dir = tmp_path / "B"
    b_dir.mkdir()
    out = b_dir / "out"
    opts = {"module": MODULE, "local_dir": out, "steps": STEPS, "save_steps": 10}
    step = await checkpoint_then_kill(bus, nats_server, b_dir, "jhf", after_steps=22, **opts)
    assert 20 < step < STEPS
    directory = out / f"checkpoint-{step}"
    commit = json.loads((directory / "COMMIT").read_text())
    assert commit["framework"] == "hf" and commit["world_size"] == 2 and commit["saga_id"] == "saga-t"
    assert {"model.safetensors", "optimizer.pt", "rng_state_0.pth", "rng_state_1.pth"} <= set(
        json.loads((directory / "MANIFEST.rank0.json").read_text())["files"]
    )
    periodic = json.loads((out / "checkpoint-20" / "COMMIT").read_text())  # the Trainer's own schedule, committed
    assert periodic["framework"] == "hf" and "saga_id" not in periodic
    output = await resume_matches(
        bus, nats_server, b_dir, "jhf", step=step, reference=reference, out=tmp_path / "b.pt", **opts
    )
    assert f"resuming from {out}/checkpoint-{step}" in output


async def test_trainer_resume_skips_a_corrupt_newest_checkpoint_with_the_reason(bus, nats_server, tmp_path):
    reference = tmp_path / "a.pt"
    await run(tmp_path / "A", "jhfc", module=MODULE, steps=40, out=reference, local_dir=tmp_path / "A" / "out")
    out = tmp_path / "B" / "out"
    (tmp_path / "B").mkdir()
    opts = {"module": MODULE, "local_dir": out, "steps": 40, "save_steps": 10}
    step = await checkpoint_then_kill(bus, nats_server, tmp_path / "B", "jhfc", after_steps=14, **opts)
    weights = out / f"checkpoint-{step}" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0x40  # one flipped bit in the newest checkpoint's weights
    weights.write_bytes(bytes(data))
    t2 = await run(tmp_path / "B", "jhfc", out=tmp_path / "b.pt", **opts)
    log = t2.output()
    assert f"skipping checkpoint {out}/checkpoint-{step}" in log and "checksum mismatch" in log
    previous = (step - 1) // 10 * 10  # the Trainer's own save before it, committed too
    assert f"resuming from {out}/checkpoint-{previous}" in log
    assert equal_params(reference, tmp_path / "b.pt")
