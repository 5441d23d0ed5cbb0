"""Saga latency with simulated ranks.

  A. on_battery -> checkpoint request seen by every one of 1,024 ranks (target <= 100 ms at 1,000)
  B. last ack of 10,240 ranks -> shutdown commands for all their nodes issued (target <= 1 s at 10,000)

A real nats-server (embedded), the coordinator as its own process, simulated ranks (core NATS
subscriptions, one per rank) and the measuring clock in this process. Writes
bench/results/saga.json. Every wait is bounded and fails naming what it waited for;
``--smoke`` runs both scenarios small (seconds: CI runs it, so a product change that breaks the
benchmark fails CI) and writes nothing unless ``--out`` is given.
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

import yaml
from _provenance import stamp

from powerguard.bus import Bus, BusNames, EmbeddedNats
from powerguard.schemas import LowBattery, NatsSettings, NodeConfig, OnBattery, PowerData, SiteConfig, UpsConfig
from powerguard.sim.agents import SimulatedRanks

RESULTS = Path(__file__).parent / "results" / "saga.json"
RANKS_PER_NODE = 8


class BenchTimeout(RuntimeError):
    """A benchmark's wait ran out: names what it waited for and what it saw."""


async def until(cond, timeout_s: float, what: str, seen=lambda: "") -> None:
    """Poll ``cond`` until true; BenchTimeout naming ``what`` (and ``seen()``) after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise BenchTimeout(f"timed out after {timeout_s:.0f}s waiting for {what}; {seen()}")
        await asyncio.sleep(0.001)


def topology(ranks: int, ranks_per_job: int) -> tuple[SiteConfig, dict[str, list[str]]]:
    nodes = [f"node{i:05d}" for i in range(ranks // RANKS_PER_NODE)]
    site = SiteConfig(
        site="bench",
        ups=[UpsConfig(name="ups-a", driver="nut")],
        nodes=[NodeConfig(name=n, feeds=["ups-a"]) for n in nodes],
        coordinator={
            "ckpt_timeout_s": 60,
            "shutdown_reserve_s": 60,
            "margin_s": 5,
            "tick_s": 0.1,
            "restore_stable_s": 0.1,
        },
    )
    per_job_nodes = ranks_per_job // RANKS_PER_NODE
    jobs = {}
    for j in range(len(nodes) // per_job_nodes):
        job_nodes = nodes[j * per_job_nodes : (j + 1) * per_job_nodes]
        jobs[f"job{j:04d}"] = [n for n in job_nodes for _ in range(RANKS_PER_NODE)]
    return site, jobs


async def start_coordinator(server: EmbeddedNats, site: SiteConfig, names: BusNames, tmp: Path):
    nats = NatsSettings(
        prefix=names.prefix,
        stream=names.stream,
        sagas_bucket=names.sagas,
        status_bucket=names.status,
        agents_bucket=names.agents,
        leases_bucket=names.leases,
    )
    cfg = site.model_copy(update={"nats": nats})
    path = tmp / f"{site.site}.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "powerguard.coordinator",
        "--config",
        str(path),
        "--nats-url",
        server.url,
        "--http-port",
        "0",
        "--instance",
        "bench",
        stderr=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.DEVNULL,
    )
    async for line in proc.stderr:
        if b"consuming inputs" in line:
            break
    drain = asyncio.create_task(_drain(proc.stderr))
    return proc, drain


async def _drain(stream) -> None:
    async for _ in stream:
        pass


def power(on_battery: bool, runtime: float) -> PowerData:
    return PowerData(site="bench", ups="ups-a", on_battery=on_battery, runtime_s=runtime, charge_pct=90)


async def scenario_a(server: EmbeddedNats, tmp: Path, *, ranks: int = 1024, runs: int = 5) -> dict:
    """Each run a fresh site (its own stream, buckets and coordinator) and its first outage: a
    flap no longer ends a saga whose ranks never answer (it restores), so a run never reuses one."""
    site, jobs = topology(ranks, 16)
    total = sum(len(r) for r in jobs.values())
    all_requested, per_rank = [], []
    for run in range(runs):
        names = BusNames.isolated(f"benchA{run}")
        bus = await Bus.connect(server.url, service="bench", names=names)
        # A measures the fan-out of requests: the ranks stay silent so that acks (B) do not share the clock
        sim = SimulatedRanks(
            bus, jobs, silent={(j, r) for j, nodes in jobs.items() for r in range(len(nodes))}, heartbeat_s=None
        )
        await sim.start(heard=True)
        proc, drain = await start_coordinator(server, site, names, tmp)
        try:
            t0 = time.perf_counter()
            await bus.publish(OnBattery(data=power(True, 3000)))
            await until(
                lambda sim=sim: len(sim.requests_seen) >= total,
                30,
                f"every one of {total} ranks to see its checkpoint request (run {run + 1})",
                lambda sim=sim: f"{len(sim.requests_seen)} saw it",
            )
            seen = [t - t0 for t in sim.requests_seen.values()]
            all_requested.append(max(seen))
            per_rank += seen
        finally:
            proc.terminate()
            await proc.wait()
            drain.cancel()
            await sim.stop()
            await bus.close()
    return {
        "ranks": total,
        "runs": runs,
        "all_ranks_requested_ms": {"p50": _ms(statistics.median(all_requested)), "max": _ms(max(all_requested))},
        "per_rank_ms": {"p50": _ms(statistics.median(per_rank)), "max": _ms(max(per_rank))},
        "target_ms": 100,
    }


async def scenario_b(server: EmbeddedNats, tmp: Path, *, ranks: int = 10_240) -> dict:
    site, jobs = topology(ranks, 64)
    names = BusNames.isolated("benchB")
    bus = await Bus.connect(server.url, service="bench", names=names)
    sim = SimulatedRanks(bus, jobs, heartbeat_s=None)
    t = time.perf_counter()
    await sim.start(heard=True)
    register_s = time.perf_counter() - t
    proc, drain = await start_coordinator(server, site, names, tmp)
    shutdowns: dict[str, float] = {}

    async def on_cmd(msg) -> None:
        if b"shutdown_requested" in msg.data:
            shutdowns.setdefault(msg.subject, time.perf_counter())

    sub = await bus.nc.subscribe(bus.subjects.power_cmd("*"), cb=on_cmd)
    try:
        t0 = time.perf_counter()
        # low battery with 300 s left: checkpoint budget 235 s, and shutdown as soon as every rank acked
        await bus.publish(LowBattery(data=power(True, 300).model_copy(update={"status": ["OB", "LB"]})))
        nodes = len(site.nodes)
        await until(
            lambda: len(shutdowns) >= nodes,
            120,
            f"shutdown commands for all {nodes} nodes",
            lambda: (
                f"{len(shutdowns)} issued, {len(sim.requests_seen)} ranks requested, "
                f"{sum(len(a) for a in sim.acked.values())} acked"
            ),
        )
        last_ack = max(sim.acked_at.values())
        requested = max(sim.requests_seen.values()) - t0
    finally:
        await sub.unsubscribe()
        proc.terminate()
        await proc.wait()
        drain.cancel()
        await sim.stop()
        await bus.close()
    return {
        "ranks": sum(len(r) for r in jobs.values()),
        "nodes": len(site.nodes),
        "jobs": len(jobs),
        "register_s": round(register_s, 2),
        "all_ranks_requested_ms": _ms(requested),
        "acks_window_s": round(last_ack - min(sim.acked_at.values()), 3),
        "last_ack_to_all_shutdowns_ms": _ms(max(shutdowns.values()) - last_ack),
        "last_ack_to_first_shutdown_ms": _ms(min(shutdowns.values()) - last_ack),
        "target_ms": 1000,
    }


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


async def _run(sync: str, *, ranks_a: int, ranks_b: int, runs: int) -> tuple[dict, dict]:
    with tempfile.TemporaryDirectory() as tmp, EmbeddedNats(store_dir=tmp, sync=sync) as server:
        a = await scenario_a(server, Path(tmp), ranks=ranks_a, runs=runs)
        print(
            f"[sync_interval {sync}] A {a['ranks']} ranks: on_battery -> every rank requested  "
            f"p50 {a['all_ranks_requested_ms']['p50']} ms, max {a['all_ranks_requested_ms']['max']} ms "
            "(target <= 100 ms)"
        )
        b = await scenario_b(server, Path(tmp), ranks=ranks_b)
        print(
            f"[sync_interval {sync}] B {b['ranks']} ranks: last ack -> {b['nodes']} shutdown commands  "
            f"{b['last_ack_to_all_shutdowns_ms']} ms (target <= 1000 ms); on_battery -> every rank requested "
            f"{b['all_ranks_requested_ms']} ms"
        )
    return a, b


async def main(argv: list[str] | None = None) -> None:
    """Both scenarios with the broker setting PowerGuard ships (``sync_interval: always``: every
    write fsynced before it is acknowledged), then with NATS's default (2m), in one run."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks-a", type=int, default=1024)
    ap.add_argument("--ranks-b", type=int, default=10_240)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--smoke", action="store_true", help="A 64 ranks, B 512 ranks, one run, shipped sync only")
    ap.add_argument("--out", type=Path, default=None, help=f"results file (default {RESULTS}; none with --smoke)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.ranks_a, args.ranks_b, args.runs = 64, 512, 1
    sizes = {"ranks_a": args.ranks_a, "ranks_b": args.ranks_b, "runs": args.runs}
    a, b = await _run("always", **sizes)
    a2, b2 = (a, b) if args.smoke else await _run("2m", **sizes)
    result = {
        "machine": f"{os.cpu_count()} cores",
        "python": sys.version.split()[0],
        "date": time.strftime("%Y-%m-%d"),
        "broker_sync_interval": "always",
        "on_battery_to_requests": a,
        "last_ack_to_shutdown": b,
        "broker_sync_cost": {
            sync: {
                "on_battery_to_requests_p50_ms": x["all_ranks_requested_ms"]["p50"],
                "last_ack_to_all_shutdowns_ms": y["last_ack_to_all_shutdowns_ms"],
                "register_s": y["register_s"],
            }
            for sync, x, y in (("always", a, b), ("2m", a2, b2))
        },
    }
    out = args.out or (None if args.smoke else RESULTS)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(stamp(result), indent=2) + "\n")
        print(f"wrote {out}")


if __name__ == "__main__":
    asyncio.run(main())
