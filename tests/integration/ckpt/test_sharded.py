"""Sharded jobs on the shared tier (real torch.distributed ranks, gloo on CPU): FSDP2, tensor
parallel (DTensor), HSDP (FSDP2 on a 2-D mesh) and FSDP2 + tensor parallel (2-D), checkpointed at
step 20, stopped, restarted: the final model is bit for bit the one an uninterrupted run of the
same command trains. An FSDP2 checkpoint of 4 ranks restored by 2: refused without ``reshard``
(naming the world sizes), loaded exactly with it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

TORCHRUN = Path(sys.executable).parent / "torchrun"


def train(tmp: Path, shard: str, *args: str, ranks: int = 2, ok: bool = True) -> str:
    argv = [str(TORCHRUN), "--standalone", "--nproc-per-node", str(ranks), "-m", "powerguard.sim.train"]
    argv += ["--job", f"j{shard}", "--shard", shard, *args]
    r = subprocess.run(
        argv, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"}, cwd=tmp
    )
    assert (r.returncode == 0) == ok, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout + r.stderr


@pytest.mark.parametrize(("shard", "ranks"), [("fsdp", 2), ("tp", 2), ("hsdp", 4), ("fsdp-tp", 4)])
def test_a_sharded_job_resumes_bit_exact_against_an_uninterrupted_run(tmp_path, shard, ranks):
    ref = ["--steps", "40", "--local-dir", str(tmp_path / "ref-ckpt"), "--out", str(tmp_path / "ref.pt")]
    train(tmp_path, shard, *ref, ranks=ranks)
    ckpt = str(tmp_path / "ckpt")
    train(tmp_path, shard, "--steps", "25", "--save-at", "20", "--local-dir", ckpt, ranks=ranks)  # stopped after 24
    out = train(tmp_path, shard, "--steps", "40", "--local-dir", ckpt, "--out", str(tmp_path / "final.pt"), ranks=ranks)
    assert f"powerguard: job j{shard} resumed at step 21 from the local tier's checkpoint of step 20" in out
    want, got = torch.load(tmp_path / "ref.pt"), torch.load(tmp_path / "final.pt")
    assert want.keys() == got.keys()
    differ = [k for k in want if not torch.equal(want[k], got[k])]
    assert differ == [], f"{shard}: tensors that differ after the resume: {differ}"


def test_an_fsdp2_checkpoint_of_4_ranks_on_2_is_refused_without_reshard_and_loaded_exactly_with_it(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    # 4 ranks train steps 0..20 and checkpoint step 20; the full model at that point
    train(tmp_path, "fsdp", "--steps", "21", "--save-at", "20", "--local-dir", ckpt, "--out", "saved.pt", ranks=4)
    refused = train(tmp_path, "fsdp", "--steps", "21", "--local-dir", ckpt, ranks=2, ok=False)
    assert "NoRestorableCheckpoint" in refused and "written by 4 ranks, this job has 2" in refused, refused[-3000:]
    # with reshard: DCP reshards the FSDP2 shards over 2 ranks; nothing trains after the restore
    out = train(tmp_path, "fsdp", "--steps", "21", "--reshard", "--local-dir", ckpt, "--out", "loaded.pt", ranks=2)
    assert "powerguard: job jfsdp resumed at step 21 from the local tier's checkpoint of step 20" in out
    want, got = torch.load(tmp_path / "saved.pt"), torch.load(tmp_path / "loaded.pt")
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
