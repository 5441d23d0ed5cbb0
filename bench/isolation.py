"""A training job's flood never delays a power event: the time from ups-monitor's ``on_battery``
to the other job's checkpoint request on its own subject, with an idle bus and while jobA's agent
credential floods its own ack subject at the highest rate the server takes (and a burst of
60,000 messages), on the shipped configuration: a real nats-server with ``compose/nats.conf``
(``sync_interval: always``), the credentials of ``powerguard creds``, the coordinator and
power-control (dry-run devices) as their own processes, the flood from a process of its own
(``tests/security/flood.py``, the same rounds as ``tests/security/test_flood.py``). Rounds
alternate idle / flood / idle / burst ``--reps`` times; every flood and burst round also shuts
down (the UPS then says 50 s, below the 60 s reserve) and records n2's shutdown against that.

Writes bench/results/isolation.json: ``idle_request_ms`` and ``flood_request_ms`` (p50 / p99,
the burst's rounds counted with the flood's), ``flood_over_idle`` (flood p50 over idle p50;
target <= 2), the shutdown times, and ``kinds``: per flood kind (``flood``, ``burst``, ``acks64``:
a job's 16 KiB junk over 64 of its rank subjects, ``drill1mb``: the operator's 1 MB drill
readings, ``registry``: a job filling the shared agent registry with its own keys, and the
outage then shutting down: jobB's node off within the battery) the same figures and the
messages the flooder's process actually published.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "bench" / "results" / "isolation.json"

from tests.security.conftest import SITE, start  # noqa: E402
from tests.security.flood import rounds  # noqa: E402


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return round(s[min(len(s) - 1, int(q * len(s)))], 1)


KINDS = ("flood", "burst", "acks64", "drill1mb", "registry")


def by_kind(rounds: list[dict]) -> dict:
    """Per flood kind: its rounds' request times against every idle round's (medians computed,
    with their n), and the messages the flooder's process published in each of its rounds."""
    idle = [r["request_ms"] for r in rounds if r["kind"] == "idle"]
    out = {}
    for kind in KINDS:
        mine = [r for r in rounds if r["kind"] == kind]
        if not mine:
            continue
        ms = [r["request_ms"] for r in mine]
        out[kind] = {
            "idle_request_ms": {"p50": round(statistics.median(idle), 1), "max": max(idle), "n": len(idle)},
            "flood_request_ms": {"p50": round(statistics.median(ms), 1), "max": max(ms), "n": len(ms)},
            "flood_over_idle": round(statistics.median(ms) / statistics.median(idle), 2),
            "sent": [r["junk_sent"] for r in mine],  # what the flooder's process published, each round
        }
    return out


async def run(reps: int) -> dict:
    plan: list[tuple[str, bool]] = []
    for _ in range(reps):
        plan += [("idle", False), ("flood", True), ("idle", False), ("burst", True)]
        plan += [("idle", False), ("acks64", False), ("idle", False), ("drill1mb", False)]
        plan += [("idle", False), ("registry", True)]
    with tempfile.TemporaryDirectory(prefix="pg-isolation-") as tmp:
        dep = start(Path(tmp))
        try:
            admin = await dep.connect("admin")
            await admin.bootstrap([SITE])
            got = await rounds(dep, Path(tmp), plan)
        finally:
            await dep.close()
    idle = [r.request_ms for r in got if r.kind == "idle"]
    flood = [r.request_ms for r in got if r.kind in ("flood", "burst")]
    kinds = by_kind([r.__dict__ for r in got])
    return {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "reps": reps,
        "idle_request_ms": {"p50": pct(idle, 0.5), "p99": pct(idle, 0.99)},
        "flood_request_ms": {"p50": pct(flood, 0.5), "p99": pct(flood, 0.99)},
        "flood_over_idle": round(statistics.median(flood) / statistics.median(idle), 2),
        "target_flood_over_idle": 2.0,
        "shutdown_s": {r.kind: [x.shutdown_s for x in got if x.kind == r.kind] for r in got if r.kind != "idle"},
        "battery_s_at_stop": 50.0,
        "junk_sent": {k: v["sent"] for k, v in kinds.items()},
        "kinds": kinds,
        "rounds": [r.__dict__ for r in got],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5, help="idle/flood/idle/burst cycles (default 5)")
    ap.add_argument("--smoke", action="store_true", help="one cycle (CI: the benchmark runs)")
    ap.add_argument("--out", type=Path, default=RESULTS, help=f"results file (default {RESULTS})")
    args = ap.parse_args()
    res = asyncio.run(run(1 if args.smoke else args.reps))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1) + "\n")
    print(
        f"idle {res['idle_request_ms']} ms, flood {res['flood_request_ms']} ms, "
        f"flood/idle {res['flood_over_idle']} (target <= 2); shutdowns {res['shutdown_s']} s of 50 s"
    )


if __name__ == "__main__":
    main()
