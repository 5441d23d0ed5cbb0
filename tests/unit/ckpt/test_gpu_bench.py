"""bench/gpu_checkpoint.py runs small on CPU in CI (on a lent GPU it runs at one node's size):
the figures it writes are there and sane, and the checkpoint it timed is committed."""

from __future__ import annotations

from tests.bench_modules import load

bench = load("gpu_checkpoint")  # its helpers (bench/_state.py) importable, as when it runs as a script


def test_gpu_checkpoint_bench_runs_small_on_cpu(tmp_path):
    r = bench.run(0.02, 2, tmp_path)
    assert r["pinned"] == (r["device"] != "cpu")  # host buffers pinned exactly when a GPU copies into them
    assert 0.015 <= r["state_gb"] <= 0.04  # the size asked for (model + AdamW state), not a token amount
    assert r["staging_reused_buffers_gb_s"] > 0 and r["staging_fresh_copy_gb_s"] > 0
    assert r["power_checkpoint_stall_s"] > 0 and r["power_checkpoint_write_s"] > 0
    assert r["power_checkpoint_commit_s"] >= 0
    step = tmp_path / "gpu-bench" / "step-1"
    assert (step / "COMMIT").exists()  # keep=1: the last save, committed
    written = sum(f.stat().st_size for f in step.glob("*.distcp"))
    assert written >= 0.9 * r["state_gb"] * 1e9  # the state it timed is the state on disk
