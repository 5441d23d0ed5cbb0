"""Work lost per hold policy and scenario: runs `powerguard demo` for every hold policy
(checkpoint-at-stop, pause, continue) and scenario (outage, flap, race, and real-ups: a real
NUT upsd whose runtime estimate drops from 600 s to 100 s, below the 120 s reserve, with a load
jump, in the second of two outages) on the simulated site,
same seed and same site each time, and records what the ranks really trained twice (from their
progress file), what the saga recorded, the hold, and the UPS at the stop. Writes
bench/results/hold_policies.json (docs/performance.md is rendered from it by report.py)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results"
POLICIES = ("checkpoint-at-stop", "pause", "continue")
SCENARIOS = ("outage", "flap", "race", "real-ups")


def one(policy: str, scenario: str, work: Path) -> dict:
    report_file = work / f"{policy}-{scenario}.json"
    flags = {"outage": [], "flap": ["--flap"], "race": ["--race"], "real-ups": ["--real-ups"]}[scenario]
    r = subprocess.run(
        [sys.executable, "-m", "powerguard.cli", "demo", *flags, "--hold-policy", policy, "--json", str(report_file)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if not report_file.exists():
        return {"policy": policy, "scenario": scenario, "error": (r.stdout + r.stderr)[-2000:]}
    return row(policy, scenario, json.loads(report_file.read_text()), r.returncode)


def row(policy: str, scenario: str, rep: dict, exit_code: int) -> dict:
    """One drill's report -> its row of hold_policies.json (CI: tests/e2e/test_drill.py's pause
    and continue drills go through it)."""
    w, b, s = rep["work"], rep.get("battery_at_stop") or {}, rep.get("saga") or {}
    return {
        "policy": policy,
        "scenario": scenario,
        "exit": exit_code,
        "saga_states": rep["saga_states"],
        "step_at_detection": rep["step_at_detection"],
        "checkpoint_step": rep["checkpoint_step"],
        "final_checkpoint_step": rep["final_checkpoint_step"],
        "stop_step": w["stop_step"],
        "restored_step": rep["restored_step"],
        "restarted": rep["restarted"],
        "steps_trained_since_detection": w["steps_trained_since_detection"],
        "steps_kept": w["steps_kept"],
        "lost_steps": w["lost_steps"],
        "lost_s": w["lost_s"],
        "saga_lost_steps": s.get("lost_steps"),
        "hold_s": s.get("hold_s"),
        "longest_stall_s": w["longest_stall_s"],
        "battery": b,
        "bit_exact": rep["bit_exact"],
        "training_resumed_s": rep["training_resumed_s"],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--policies", nargs="*", default=list(POLICIES))
    p.add_argument("--scenarios", nargs="*", default=list(SCENARIOS))
    p.add_argument("--merge", action="store_true", help="Keep the other rows of the existing file")
    args = p.parse_args()
    OUT.mkdir(exist_ok=True)
    rows = []
    if args.merge and (OUT / "hold_policies.json").exists():
        done = {(p_, s_) for p_ in args.policies for s_ in args.scenarios}
        old = json.loads((OUT / "hold_policies.json").read_text())["runs"]
        rows = [r for r in old if (r["policy"], r["scenario"]) not in done]
    with tempfile.TemporaryDirectory(prefix="pg-hold-") as tmp:
        for policy in args.policies:
            for scenario in args.scenarios:
                row = one(policy, scenario, Path(tmp))
                rows.append(row)
                print(json.dumps(row), flush=True)
    (OUT / "hold_policies.json").write_text(json.dumps({"runs": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
