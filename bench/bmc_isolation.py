"""One dead BMC never slows another: power-control's shutdown and power-on of 8 nodes with real
BMCs (OpenIPMI ``ipmi_sim`` and the project's simulated IPMI BMC, each its own process), once
with all 8 alive and once with 2 of them dead (their process stopped: UDP unanswered), in one
run, alternated ``--reps`` times. Measured per healthy node: the command's start -> ``off``
(shutdown) and -> ``ready`` (power-on), as power-control reported them; the figure is the
healthy nodes' slowest time with 2 dead over the slowest with all alive (``healthy_slowdown``,
target <= 1.2; also each run's on its own). power-control's default settings (IPMI through
ipmitool, one process per request; device timeout 10 s, 3 retries, 4 power-ons in parallel), so
a dead BMC takes as long to give up as it would on a site. With 2 dead there are 2 fewer peer
processes on the CPU, so on a small machine the healthy nodes are faster than with all alive.

Writes bench/results/bmc_isolation.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "bench" / "results" / "bmc_isolation.json"

from tests.integration.power.peers import PASSWORD, USER, IpmiSim, PyghmiBmc  # noqa: E402

NODES = [f"n{i}" for i in range(8)]
IPMI_SIM = {"n0", "n1", "n4"}  # OpenIPMI; the rest are the project's simulated BMC
DEAD = ("n1", "n5")  # one of each kind


def start_peers(tmp: Path) -> dict:
    peers = {}
    for n in NODES:
        d = tmp / n
        d.mkdir()
        peers[n] = IpmiSim(d).start() if n in IPMI_SIM else PyghmiBmc(d, n, boot_delay=0.5, soft_off_delay=0.5).start()
    return peers


SMOKE_SETTINGS = {"device_timeout_s": 1.0, "retries": 0}  # a dead BMC given up on in about a second


def site(peers: dict, extra: dict | None = None):
    from powerguard.schemas import SiteConfig

    cred = {"username": {"env": "PG_BENCH_BMC_USER"}, "password": {"env": "PG_BENCH_BMC_PW"}}
    return SiteConfig.model_validate(
        {
            "site": "bench",
            "ups": [{"name": "ups-a", "driver": "nut"}],
            "nodes": [
                {"name": n, "feeds": ["ups-a"], "bmc": {"driver": "ipmi", "port": p.port, **cred}}
                for n, p in peers.items()
            ],
            "power_control": {"poll_interval_s": 0.2, "soft_off_timeout_s": 5.0, **(extra or {})},
        }
    )


def set_power(peer, on: bool) -> None:
    if isinstance(peer, IpmiSim):
        peer.state.write_text("1\n" if on else "0\n")
    else:
        peer.state.write_text(json.dumps({"power": "on" if on else "off", "policy": 0, "changes": 0}))


async def one_round(cfg, dead: tuple[str, ...]) -> dict:
    """Shutdown of every node, then power-on of every node, from a fresh power-control."""
    from powerguard.power_control.drivers import Devices
    from powerguard.power_control.schedulers.base import NoScheduler
    from powerguard.power_control.sequences import Order, Sequencer
    from powerguard.power_control.service import load_settings
    from powerguard.schemas import NodeState

    settings = load_settings(cfg)
    seen: dict[tuple[str, str], float] = {}

    async def emit(ev) -> None:
        if isinstance(ev, NodeState) and ev.data.state in ("off", "ready"):
            seen.setdefault((ev.data.node, ev.data.state), time.monotonic())

    devices = Devices(cfg, settings)
    seq = Sequencer(devices, NoScheduler(), settings, emit)
    healthy = [n for n in NODES if n not in dead]
    try:
        t0 = time.monotonic()
        await asyncio.gather(*(seq.shutdown(Order(saga_id="b", node=n, key=f"b/{n}/shutdown")) for n in NODES))
        off = {n: round(seen[(n, "off")] - t0, 3) for n in healthy if (n, "off") in seen}
        t1 = time.monotonic()
        await seq.restore([Order(saga_id="b", node=n, key=f"b/{n}/power_on") for n in NODES])
        ready = {n: round(seen[(n, "ready")] - t1, 3) for n in healthy if (n, "ready") in seen}
    finally:
        await devices.close()
    missing = [n for n in healthy if n not in off or n not in ready]
    if missing:
        raise SystemExit(f"healthy nodes without a result ({missing}): the bench measured nothing for them")
    return {"off_s": off, "ready_s": ready, "off_max_s": max(off.values()), "ready_max_s": max(ready.values())}


async def run(reps: int, extra: dict | None = None) -> dict:
    os.environ["PG_BENCH_BMC_USER"], os.environ["PG_BENCH_BMC_PW"] = USER, PASSWORD
    rounds: dict[str, list[dict]] = {"all_alive": [], "two_dead": []}
    with tempfile.TemporaryDirectory(prefix="pg-bmc-iso-") as tmp:
        peers = start_peers(Path(tmp))
        cfg = site(peers, extra)
        try:
            for rep in range(reps):
                for kind in ("all_alive", "two_dead"):
                    dead = DEAD if kind == "two_dead" else ()
                    for p in peers.values():
                        set_power(p, True)
                    for n in dead:
                        peers[n].stop()
                    r = await one_round(cfg, dead)
                    for n in dead:
                        peers[n].start()
                    rounds[kind].append(r)
                    print(
                        f"rep {rep} {kind}: off max {r['off_max_s']:.2f}s, ready max {r['ready_max_s']:.2f}s",
                        flush=True,
                    )
        finally:
            for p in peers.values():
                p.stop()
    return {
        "nodes": len(NODES),
        "dead": list(DEAD),
        "ipmi_sim": sorted(IPMI_SIM),
        "reps": reps,
        "power_control_overrides": extra or {},
        **summary(rounds),
        "rounds": rounds,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def summary(rounds: dict[str, list[dict]]) -> dict:
    """Medians of the alternated runs, and the runs where a healthy node was an outlier (over
    twice the slowest healthy node with all alive): the median hides them, so they are counted."""
    med = {k: {m: statistics.median(r[m] for r in v) for m in ("off_max_s", "ready_max_s")} for k, v in rounds.items()}
    alive, dead = med["all_alive"], med["two_dead"]
    worst_alive = max(max(r["off_max_s"], r["ready_max_s"]) for r in rounds["all_alive"])
    outliers = [
        {"run": i, "node": n, "phase": phase, "s": t}
        for i, r in enumerate(rounds["two_dead"])
        for phase, key in (("off", "off_s"), ("power-on", "ready_s"))
        for n, t in r[key].items()
        if t > 2 * worst_alive
    ]
    total_alive = alive["off_max_s"] + alive["ready_max_s"]
    total_dead = dead["off_max_s"] + dead["ready_max_s"]
    per_run = [
        round((d["off_max_s"] + d["ready_max_s"]) / (a["off_max_s"] + a["ready_max_s"]), 3)
        for a, d in zip(rounds["all_alive"], rounds["two_dead"], strict=False)
    ]
    from powerguard.power_control.config import IpmiOptions

    return {
        "transport": IpmiOptions().transport,  # power-control's default IPMI transport
        "median": med,
        "healthy_slowdown": round(total_dead / total_alive, 3),
        "off_slowdown": round(dead["off_max_s"] / alive["off_max_s"], 3),
        "power_on_slowdown": round(dead["ready_max_s"] / alive["ready_max_s"], 3),
        "outlier_runs": len({o["run"] for o in outliers}),
        "outliers": outliers,
        "slowdown_per_run": per_run,  # each run's 2-dead time over the all-alive run beside it
        "worst_run_slowdown": max(per_run),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--summarize", action="store_true", help="Recompute the summary of --out's runs; run nothing")
    p.add_argument(
        "--smoke", action="store_true", help=f"one rep with {SMOKE_SETTINGS} (CI: the benchmark runs; not a figure)"
    )
    args = p.parse_args()
    if args.smoke:
        result = asyncio.run(run(1, SMOKE_SETTINGS))
    elif args.summarize:
        result = json.loads(args.out.read_text())
        result.update(summary(result["rounds"]))
    else:
        result = asyncio.run(run(args.reps))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"healthy_slowdown {result['healthy_slowdown']} (off {result['off_slowdown']}, "
        f"power-on {result['power_on_slowdown']}); outlier runs {result['outlier_runs']} of {result['reps']}; "
        f"{args.out}"
    )


if __name__ == "__main__":
    main()
