"""The power-on ramp at scale: power-control (in-process, a real embedded nats-server) restores
N dry-run nodes (default 1,000, each behind its own switched-PDU outlet, 50 per PDU) under a
site ramp (default 6,000 nodes/min = 100/s) with no batch limit, so the ramp alone paces it.
Measured: the first node's power-on -> every node ready, against what the ramp allows
((N - 1) / rate); the first to the last power-on; the spacing of the power-ons as the nodes'
``booting`` states arrive (an observer's clock: bus latency and event-loop load included).

Writes bench/results/ramp.json.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "ramp.json"


async def run(nodes: int, per_min: float) -> dict:
    from powerguard.bus import Bus, BusNames, EmbeddedNats
    from powerguard.power_control.config import PowerControlSettings
    from powerguard.power_control.service import PowerControl
    from powerguard.schemas import NodeState, PowerCommandData, PowerOnRequested, SiteConfig

    names = [f"gpu{i:05d}" for i in range(nodes)]
    site = SiteConfig.model_validate(
        {
            "site": "bench",
            "ups": [{"name": "ups-a", "driver": "nut"}],
            "pdus": [{"name": f"pdu{p}", "host": "127.0.0.1"} for p in range((nodes + 49) // 50)],
            "nodes": [
                {
                    "name": n,
                    "feeds": ["ups-a"],
                    "outlets": [{"pdu": f"pdu{i // 50}", "outlet": i % 50 + 1}],
                    "bmc": {"driver": "dry-run", "host": "127.0.0.1"},
                }
                for i, n in enumerate(names)
            ],
            "power_control": {
                "dry_run": True,
                "require_saga": False,
                "gather_s": 1.0,
                "outlet_stagger_s": 0.0,
                "max_parallel_power_on": nodes,
                "poll_interval_s": 0.05,
                "max_parallel_per_driver": {"dry-run": 100_000},
                "ramp": {"nodes_per_min": per_min},
            },
        }
    )
    with EmbeddedNats() as server:
        bus = await Bus.connect(server.url, service="bench-ramp", names=BusNames())
        ready: dict[str, float] = {}
        booting: dict[str, float] = {}

        async def seen(ev) -> None:
            if isinstance(ev, NodeState):
                if ev.data.state == "ready":
                    ready.setdefault(ev.data.node, time.monotonic())
                elif ev.data.state == "booting":
                    booting.setdefault(ev.data.node, time.monotonic())

        await bus.consume(
            NodeState, handler=seen, durable="bench-ramp", subject=bus.subjects.power_result("*"), deliver="new"
        )
        pc = PowerControl(bus, site, PowerControlSettings.model_validate(site.section("power_control")))
        await pc.start()
        for n in names:  # the nodes are off (the outage's shutdown): the dry-run BMCs say so
            pc.seq.devices.bmc(n).state = "off"
        t0 = time.monotonic()
        for n in names:
            await bus.publish(
                PowerOnRequested(data=PowerCommandData(saga_id="bench", node=n, idempotency_key=f"bench/{n}/on"))
            )
        t_sent = time.monotonic()
        while len(ready) < nodes and time.monotonic() - t0 < 600:
            await asyncio.sleep(0.2)
        t_end = max(ready.values()) if ready else time.monotonic()
        await pc.stop()
        await bus.close()
    starts = sorted(booting.values())
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    allowed = (nodes - 1) * 60.0 / per_min
    first = starts[0] if starts else t0
    return {
        "nodes": nodes,
        "nodes_per_min": per_min,
        "ready": len(ready),
        "commands_published_s": round(t_sent - t0, 2),
        "ramp_allows_s": round(allowed, 2),
        "first_power_on_to_last_ready_s": round(t_end - first, 2),
        "first_to_last_power_on_s": round(starts[-1] - first, 2) if starts else None,
        "ratio": round((t_end - first) / allowed, 3) if allowed else None,
        "power_on_gap_p50_ms": round(statistics.median(gaps) * 1e3, 1) if gaps else None,
        "power_on_gap_min_ms": round(min(gaps) * 1e3, 1) if gaps else None,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--per-min", type=float, default=6000.0, help="the ramp, node power-ons per minute")
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args()
    r = asyncio.run(run(args.nodes, args.per_min))
    Path(args.out).write_text(json.dumps(r, indent=2) + "\n")
    print(json.dumps(r, indent=2))


if __name__ == "__main__":
    main()
