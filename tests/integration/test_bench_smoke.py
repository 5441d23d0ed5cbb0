"""The scale benchmarks at their smoke sizes (seconds each): a product change that breaks a
benchmark (a wait that never ends, a renamed figure) fails here, not months later. Each writes
its figures to a temporary file; bench/results/ is left as it is."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
BENCH = Path(__file__).resolve().parents[2] / "bench"

SMOKES = {
    "saga": (["--smoke"], lambda r: r["last_ack_to_shutdown"]["last_ack_to_all_shutdowns_ms"] >= 0),
    "scale": (
        ["--ranks", "2000", "--arrival-runs", "1"],
        lambda r: r["sizes"][0]["ack_cpu_us_per_rank"] > 0 and r["sizes"][0]["shutdown_commands_at_last_ack"] == 250,
    ),
    "fanout": (["--ranks", "2000", "--ckpt-s", "0", "--sync-ranks", "0"], lambda r: r["sizes"]),
    "ramp": (["--nodes", "200"], lambda r: r),
}


@pytest.mark.parametrize("name", sorted(SMOKES))
def test_the_benchmark_runs_at_its_smoke_size(name, tmp_path):
    args, check = SMOKES[name]
    out = tmp_path / f"{name}.json"
    run = subprocess.run(
        [sys.executable, str(BENCH / f"{name}.py"), *args, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert check(json.loads(out.read_text())), out.read_text()[:2000]
