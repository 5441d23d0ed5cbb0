"""The power-on ramp at scale: power-control (in this process, a real embedded nats-server)
restores N dry-run nodes (default 1,000, each behind its own switched-PDU outlet, 50 per PDU)
under a site ramp (default 6,000 nodes/min = 100/s) with no batch limit, so the ramp alone paces
it. The power-on commands are published, and the nodes' states observed, by a second process
(the coordinator and an observer are other processes on a real site; sharing power-control's
event loop with them made the ramp late while 12,500 commands arrived). Measured: the first
node's power-on -> every node ready, against what the ramp allows ((N - 1) / rate); the first
to the last power-on; how far behind the ramp's pace it was after each quarter of the nodes;
the spacing of the power-ons as the nodes' ``booting`` states arrive (an observer's clock: bus
latency included). CLOCK_MONOTONIC is one clock for both processes.

Writes bench/results/ramp.json.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "ramp.json"


async def site_side(url: str, nodes: int) -> dict:
    """The coordinator's power-on commands and an observer of the nodes' states."""
    from powerguard.bus import Bus, BusNames
    from powerguard.schemas import NodeState, PowerCommandData, PowerOnRequested

    names = [f"gpu{i:05d}" for i in range(nodes)]
    bus = await Bus.connect(url, service="bench-ramp-site", names=BusNames())
    ready: dict[str, float] = {}
    booting: dict[str, float] = {}
    done = asyncio.Event()

    async def seen(ev) -> None:
        if isinstance(ev, NodeState):
            if ev.data.state == "ready":
                ready.setdefault(ev.data.node, time.monotonic())
                if len(ready) == nodes:
                    done.set()
            elif ev.data.state == "booting":
                booting.setdefault(ev.data.node, time.monotonic())

    await bus.consume(
        NodeState, handler=seen, durable="bench-ramp", subject=bus.subjects.power_result("*"), deliver="new"
    )
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    t0 = time.monotonic()
    for n in names:
        await bus.publish(
            PowerOnRequested(data=PowerCommandData(saga_id="bench", node=n, idempotency_key=f"bench/{n}/on"))
        )
    t_sent = time.monotonic()
    try:
        await asyncio.wait_for(done.wait(), 800)
    except TimeoutError:
        pass
    await bus.close()
    return {"t0": t0, "t_sent": t_sent, "ready": ready, "booting": booting}


async def run(nodes: int, per_min: float) -> dict:
    from powerguard.bus import Bus, BusNames, EmbeddedNats
    from powerguard.power_control.config import PowerControlSettings
    from powerguard.power_control.service import PowerControl
    from powerguard.schemas import SiteConfig

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
    cpu0 = time.process_time()
    with EmbeddedNats() as server:
        side = await asyncio.create_subprocess_exec(
            sys.executable,
            __file__,
            "--site-side",
            server.url,
            "--nodes",
            str(nodes),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        assert (await asyncio.wait_for(side.stdout.readline(), 60)).strip() == b"ready"
        bus = await Bus.connect(server.url, service="bench-ramp", names=BusNames())
        pc = PowerControl(bus, site, PowerControlSettings.model_validate(site.section("power_control")))
        await pc.start()
        for n in names:  # the nodes are off (the outage's shutdown): the dry-run BMCs say so
            pc.seq.devices.bmc(n).state = "off"
        side.stdin.write(b"go\n")
        await side.stdin.drain()
        out, _ = await asyncio.wait_for(side.communicate(), 900)
        seen = json.loads(out.decode().strip().splitlines()[-1])
        await pc.stop()
        await bus.close()
    t0, t_sent, ready, booting = seen["t0"], seen["t_sent"], seen["ready"], seen["booting"]
    t_end = max(ready.values()) if ready else time.monotonic()
    starts = sorted(booting.values())
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    interval = 60.0 / per_min
    # how far behind the ramp's own pace the restore is after each quarter of the nodes (the
    # ramp cannot catch up: starts are never closer than the rate), to see where time was lost
    behind = {
        f"{q}%": round(starts[i] - starts[0] - i * interval, 2)
        for q in (1, 5, 10, 25, 50, 75, 100)
        if starts and (i := max(0, len(starts) * q // 100 - 1)) < len(starts)
    }
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
        "behind_the_ramp_s_after": behind,
        "largest_gaps": [
            {"after_node": i, "at_s": round(starts[i] - starts[0], 2), "gap_ms": round(g * 1e3, 1)}
            for i, g in sorted(enumerate(gaps), key=lambda x: -x[1])[:5]
        ],
        "power_control_process_cpu_s": round(time.process_time() - cpu0, 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--per-min", type=float, default=6000.0, help="the ramp, node power-ons per minute")
    p.add_argument("--out", default=str(RESULTS))
    p.add_argument("--site-side", metavar="URL", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.site_side:
        print(json.dumps(asyncio.run(site_side(args.site_side, args.nodes))), flush=True)
        return
    r = asyncio.run(run(args.nodes, args.per_min))
    Path(args.out).write_text(json.dumps(r, indent=2) + "\n")
    print(json.dumps(r, indent=2))


if __name__ == "__main__":
    main()
