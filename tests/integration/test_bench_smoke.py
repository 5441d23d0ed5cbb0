"""Every benchmark of ``bench/`` at its smoke size (seconds each): a product change that breaks
a benchmark (a wait that never ends, a renamed figure, a flag gone) fails here, not months later.
Each writes its figures to a temporary file; bench/results/ is left as it is. A benchmark whose
smallest size is a whole outage drill runs its own analysis on the drill a CI test already runs
(``DRILLS``: the benchmark's function named there, called by that test), not a second drill."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"


def _runs(r: dict) -> bool:
    return bool(r["runs"]) and all(r["runs"])


_NO_DRILLS = ("--service-cuts", "0", "--cluster-cuts", "0")  # outage drills: tests/powercut/test_services_cut.py

# the slowest first (they run three at a time). A smoke size is the smallest run that goes through
# the benchmark's code: one mode or framework where the others are the same loop over another
# setting (those run in CI's own tests: tests/integration/ckpt/test_sharded.py, test_lightning.py)
SMOKES = {
    "framework_callbacks": (["--frameworks", "hf", "--steps", "20", "--repeats", "1"], _runs),
    "powercut": (
        [*("--cuts", "1", "--remote-cuts", "1", "--broker-cuts", "1", "--s3-cuts", "1"), *_NO_DRILLS],
        lambda r: r["violations"] == 0 and r["checkpoint_cuts"] == r["s3_cuts"] == 1,
    ),
    "scale": (
        ["--ranks", "2000", "--arrival-runs", "1"],
        lambda r: r["sizes"][0]["ack_cpu_us_per_rank"] > 0 and r["sizes"][0]["shutdown_commands_at_last_ack"] == 250,
    ),
    "saga": (["--smoke"], lambda r: r["last_ack_to_shutdown"]["last_ack_to_all_shutdowns_ms"] >= 0),
    "object_storage": (["--smoke"], lambda r: r["tier_upload_mb_s"] > 0 and r["tier_restore_mb_s"] > 0),
    "power_checkpoint": (
        ["--sizes", "0.02", "--ranks", "1", "--reps", "1"],
        lambda r: r["power_checkpoint"]["runs"][0]["power_checkpoint_p50_s"] > 0,
    ),
    "node_tier": (
        ["--size-gb", "0.02", "--reps", "1"],
        lambda r: r["save_node_local_s"] > 0 and r["restore_sources"] == {"peer": "peer", "remote": "remote"},
    ),
    "checkpoint": (
        ["--size-gb", "0.02", "--reps", "1", "--step-iters", "5"],
        lambda r: r["durable_mb_s"] > 0 and r["durable_over_dd"] > 0,
    ),
    "upsmon_side_by_side": (["--smoke"], lambda r: r["upsmon"]["n"] == r["ups_monitor"]["n"] == 1),
    "fanout": (
        ["--ranks", "2000", "--ckpt-s", "0", "--sync-ranks", "0", "--follow-ranks", "800", "--follow-runs", "1"],
        lambda r: (
            r["sizes"]
            and {f["acks"] for f in r["coordinator_follows"]} == {"rank", "job"}
            and all(f["coordinator"]["shutdown_commands_published"] == 100 for f in r["coordinator_follows"])
        ),
    ),
    "consumer_path": (["--acks", "2000"], lambda r: r["consumer_cpu_us_per_ack"] > 0 and r["fetch_us"] > 0),
    "registrations": (
        ["--ranks", "2000", "--compare-disk", "0"],
        lambda r: (
            r["sizes"][0]["registry_ranks"] == 2000
            and r["sizes"][0]["heartbeat_round_s"] > 0
            and r["sizes"][0]["heartbeat_busiest_server_cpu_us"] > 0
        ),
    ),
    "sharded_step": (["--ranks", "2", "--shards", "fsdp", "--steps", "20", "--block", "5"], _runs),
    "step_boundary": (["--ranks", "2", "--modes", "paced-pipelined", "--steps", "20"], _runs),
    "detection": (
        ["--smoke"],
        lambda r: (
            all(r[k]["n"] == 2 for k in ("nut_poll", "snmp_poll", "snmp_trap"))
            and r["poll_200_ups_cpu_pct_of_one_core"] > 0
        ),
    ),
    "isolation": (
        ["--smoke"],
        lambda r: (
            r["reps"] == 1 and len(r["rounds"]) == 10 and all(k["flood_over_idle"] > 0 for k in r["kinds"].values())
        ),
    ),
    "gpu_checkpoint": (["--size-gb", "0.02", "--reps", "1"], lambda r: r["power_checkpoint_stall_s"] > 0),
    "bmc_isolation": (["--smoke"], lambda r: r["reps"] == 1 and r["healthy_slowdown"] > 0),
    "ramp": (["--nodes", "200"], lambda r: r),
    "report": ([], None),  # renders the page from bench/results/ into the temporary file
}

# run after the others, alone: a flood at the highest rate the server takes, beside two other
# benchmarks on 2 cores, starved the broker past a 10 s publish timeout (seen in CI)
ALONE = ("isolation",)

# the benchmark -> (the CI test file that runs its drill, the benchmark's function that test calls)
DRILLS = {
    "drill": ("tests/e2e/test_drill.py", 'load("drill").breakdown('),
    "hold_policies": ("tests/e2e/test_drill.py", 'load("hold_policies").row('),
    "alerting": ("tests/e2e/test_alerting.py", 'load("alerting").figures('),
    "chaos": ("tests/reliability/test_chaos.py", "chaos._result([asdict(run)]"),
}


def test_every_benchmark_has_a_smoke_or_its_analysis_runs_on_a_ci_drill():
    scripts = {p.stem for p in BENCH.glob("*.py") if not p.stem.startswith("_")}
    assert scripts == set(SMOKES) | set(DRILLS), f"without a smoke: {sorted(scripts - set(SMOKES) - set(DRILLS))}"
    for name, (test, call) in DRILLS.items():
        assert call in (ROOT / test).read_text(), f"{test} no longer runs bench/{name}.py's {call}...)"


def smoke(name: str, tmp: Path) -> str | None:
    """Run one benchmark at its smoke size; what went wrong, or None."""
    args, check = SMOKES[name]
    tmp.mkdir()
    out = tmp / ("performance.md" if name == "report" else f"{name}.json")
    try:
        run = subprocess.run(
            [sys.executable, str(BENCH / f"{name}.py"), *args, "--out", str(out)],
            capture_output=True,
            text=True,
            timeout=300,
        )
    except subprocess.TimeoutExpired as e:
        return f"still running after {e.timeout} s: {(e.stdout or b'')[-1500:]!r} {(e.stderr or b'')[-1500:]!r}"
    if run.returncode != 0:
        return f"exit {run.returncode}: {_first_error(run.stdout + run.stderr)}"
    if not out.exists():
        return f"wrote no {out.name}: {run.stdout[-1500:]}"
    if check is None:
        return None if "## When each figure was measured" in out.read_text() else "the page lacks its sections"
    try:
        return None if check(json.loads(out.read_text())) else f"figures not as expected: {out.read_text()[:1500]}"
    except (KeyError, IndexError, TypeError, ValueError) as e:
        return f"figures not as expected ({e!r}): {out.read_text()[:1500]}"


def _first_error(output: str) -> str:
    """The first traceback (the cause: with torchrun, the ranks' own; what follows is the launcher
    reporting it) and the end of the output."""
    first = output.find("Traceback")
    head = output[first : first + 3000] + "\n[...]\n" if 0 <= first < len(output) - 1500 else ""
    return head + output[-1500:]


@pytest.mark.timeout(900)
def test_every_benchmark_runs_at_its_smoke_size(tmp_path):
    """Three at a time (most of a smoke is waiting: a server's start, a poll clock, a dead BMC's
    timeout), the slowest first, then ``ALONE``; every failure named with its output."""
    pooled = [n for n in SMOKES if n not in ALONE]
    with ThreadPoolExecutor(3) as pool:
        got = dict(zip(pooled, pool.map(lambda n: smoke(n, tmp_path / n), pooled), strict=True))
    got |= {n: smoke(n, tmp_path / n) for n in ALONE}
    failed = {n: why for n, why in got.items() if why}
    assert not failed, "\n\n".join(f"bench/{n}.py: {why}" for n, why in failed.items())
