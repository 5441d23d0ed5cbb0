"""Sharded jobs on the shared tier (real torch.distributed ranks, gloo on CPU): an FSDP2 job and
a tensor-parallel (DTensor) job, checkpointed at step 20, stopped, restarted: the final model is
bit for bit the one an uninterrupted run of the same command trains."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

TORCHRUN = Path(sys.executable).parent / "torchrun"


def train(tmp: Path, shard: str, *args: str) -> str:
    argv = [str(TORCHRUN), "--standalone", "--nproc-per-node", "2", "-m", "powerguard.sim.train"]
    argv += ["--job", f"j{shard}", "--shard", shard, *args]
    r = subprocess.run(
        argv, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"}, cwd=tmp
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout + r.stderr


@pytest.mark.parametrize("shard", ["fsdp", "tp"])
def test_a_sharded_job_resumes_bit_exact_against_an_uninterrupted_run(tmp_path, shard):
    train(
        tmp_path, shard, "--steps", "40", "--local-dir", str(tmp_path / "ref-ckpt"), "--out", str(tmp_path / "ref.pt")
    )
    ckpt = str(tmp_path / "ckpt")
    train(tmp_path, shard, "--steps", "25", "--save-at", "20", "--local-dir", ckpt)  # stopped after step 24
    out = train(tmp_path, shard, "--steps", "40", "--local-dir", ckpt, "--out", str(tmp_path / "final.pt"))
    assert f"powerguard: job j{shard} resumed at step 20 from the local tier" in out
    want, got = torch.load(tmp_path / "ref.pt"), torch.load(tmp_path / "final.pt")
    assert want.keys() == got.keys()
    differ = [k for k in want if not torch.equal(want[k], got[k])]
    assert differ == [], f"{shard}: tensors that differ after the resume: {differ}"
