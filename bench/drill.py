"""The outage drill as a benchmark: runs `powerguard demo` (the simulated site, every service as
its own process, 4 real torch.distributed ranks) and splits "utility power back -> first
training step" into what the site is configured to wait (restore_stable_s, outlet stagger,
simulated boot), what the job itself costs (process start-up, checkpoint load) and what is
PowerGuard's own software time (target: ≤ 5 s). Writes bench/results/drill.json
(+ drill.trace.json and the timeline pictures next to it) and drill_breakdown.json.

CI runs the breakdown (:func:`breakdown`) over the drill tests/e2e/test_drill.py runs: a drill
is the benchmark's smallest size, and CI runs that drill once, not twice."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results"


def breakdown(report: dict, otlp: dict) -> dict:
    """The drill's report and its trace (OTLP JSON) -> the figures of drill_breakdown.json."""
    from powerguard.sim import site as sim  # the waits the simulated site is configured with

    site = {
        "restore_stable_s": sim.RESTORE_STABLE_S,
        "outlet_stagger_s": sim.OUTLET_STAGGER_S,
        "boot_delay_s": sim.BOOT_DELAY_S,
    }
    spans = [s for rs in otlp["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]

    def t(name: str, edge: str = "startTimeUnixNano", pick=min) -> float:
        hits = [int(s[edge]) / 1e9 for s in spans if s["name"] == name]
        if not hits:
            raise SystemExit(f"the drill's trace has no span {name!r}: the breakdown cannot be made")
        return pick(hits)

    # utility return is not a span: the report has the durations from it
    back_to_resumed = report["training_resumed_s"]
    power_on = t("power_on node1,node2", "endTimeUnixNano") - t("power_on node1,node2")
    restart_to_restore = t("restore demo-train") - t("job_restart demo-train")
    restore = t("restore demo-train", "endTimeUnixNano", max) - t("restore demo-train")
    first_step = t("resume demo-train", "endTimeUnixNano") - t("restore demo-train", "endTimeUnixNano", max)
    nodes = 2
    configured = site["restore_stable_s"] + nodes * site["boot_delay_s"] + (nodes - 1) * site["outlet_stagger_s"]
    job_own = restart_to_restore + restore + max(0.0, first_step)
    software = back_to_resumed - configured - job_own
    return {
        "utility_back_to_training_resumed_s": back_to_resumed,
        "configured_waits_s": {
            "restore_stable_s": site["restore_stable_s"],
            "boot_s": nodes * site["boot_delay_s"],
            "outlet_stagger_s": (nodes - 1) * site["outlet_stagger_s"],
        },
        "power_on_sequence_s": round(power_on, 3),
        "job_process_start_s": round(restart_to_restore, 3),
        "checkpoint_load_s": round(restore, 3),
        "first_step_s": round(first_step, 3),
        "powerguard_software_s": round(software, 3),
        "detected_s": report["detected_s"],
        "all_acked_s": report["all_acked_s"],
        "rpo_steps": report["rpo_steps"],
        "bit_exact": report["bit_exact"],
        "span_count": report["span_count"],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out-dir", type=Path, default=OUT, help=f"where drill.json and the rest go (default {OUT})")
    args = p.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    report_file = args.out_dir / "drill.json"
    subprocess.run([sys.executable, "-m", "powerguard.cli", "demo", "--json", str(report_file)], check=True)
    result = breakdown(json.loads(report_file.read_text()), json.loads((args.out_dir / "drill.trace.json").read_text()))
    (args.out_dir / "drill_breakdown.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
