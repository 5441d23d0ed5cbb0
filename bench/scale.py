"""Coordinator state at scale: the site core (the product's pure saga code, fed real event
envelopes) and the saga store on a 3-node NATS cluster (three nats-server processes, R3 KV),
for a site of N simulated ranks (8 per node, jobs of 4,096 ranks).

Each size runs in its own process (so its peak RSS is its own). Measured, coordinator side:
on_battery -> every job's checkpoint request issued and the saga stored; the acks applied in
batches of the coordinator's consumer batch (``INPUT_BATCH``) with the record saved after each batch
(each batch decoded from the payloads just before it is applied, as the consumer does: the
decoding's CPU is reported apart, ``ack_decode_cpu_us_per_rank``; ``ack_cpu_us_per_rank`` is the
site core's and the store's); an outage (in a fresh process) whose acks arrive over one second,
decoded, applied and stored as they arrive (``acks_over_one_second``); the drain that stops the
jobs -> every node's shutdown command issued and stored; peak RSS and CPU seconds; the largest
KV value in the bucket, the record's size as one JSON value, and the bytes each save wrote.

Not measured here: fan-out to ranks over 12,500 NATS connections (``bench/fanout.py``), and acks
published by those connections; the figures are the coordinator's own costs (decoding included
where said), the bus's delivery not included.

Writes bench/results/scale.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _provenance import stamp
from _site import JOB_RANKS, PER_NODE, Layout, connect, durable_ack, nats_cluster, site_args

RESULTS = Path(__file__).parent / "results" / "scale.json"


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def one(ranks: int, urls: list[str]) -> dict:
    from datetime import UTC, datetime

    from powerguard.bus.roles import INPUT_BATCH as BATCH
    from powerguard.coordinator.core import SiteCore
    from powerguard.coordinator.heap import keep, settle, tune
    from powerguard.coordinator.policy import Policy
    from powerguard.coordinator.store import SagaStore
    from powerguard.schemas import OnBattery, PowerData

    rss_base = _rss_mib()
    site = Layout.of(ranks)
    nodes, jobs = site.nodes, site.jobs
    policy = Policy(hold_policy="continue", ckpt_timeout_s=600, max_on_battery_s=3600)
    core = SiteCore(site.topology(), policy, registry=site.registry(), saga_id=lambda site, now: "bench-saga")
    bus = await connect(urls, "bench-scale")
    store = SagaStore(await bus.sagas())
    now = time.time()

    def power(runtime_s: float) -> OnBattery:
        data = PowerData(site="bench", ups="ups-a", on_battery=True, runtime_s=runtime_s, charge_pct=90)
        return OnBattery(time=datetime.fromtimestamp(now, UTC), data=data)

    rev = 0
    saves: list[dict] = []

    async def store_changed(step) -> None:
        nonlocal rev
        for rec in step.changed:
            rev = await (store.create(rec) if rev == 0 else store.save(rec, rev))
            saves.append(dict(store.last_write))

    tune()  # as the coordinator's process does at its start (coordinator/heap.py)
    heap_settle_s = settle()  # what the idle coordinator does every minute (coordinator/heap.py)
    cpu0, t0 = time.process_time(), time.perf_counter()
    step = core.apply([(power(3000.0), None)], now)
    await store_changed(step)
    detect_s = time.perf_counter() - t0
    requests = [c for cmds in step.commands.values() for c in cmds if c.kind == "ckpt_request"]
    rec = core.open["bench-saga"]

    acks = _acks(rec, jobs)
    random.Random(1).shuffle(acks)
    batch_s: list[float] = []
    ack_cpu = decode_cpu = 0.0
    for i in range(0, len(acks), BATCH):
        cd = time.process_time()
        events = _decoded(acks[i : i + BATCH])  # the bus's part: measured apart
        decode_cpu += time.process_time() - cd
        tb, cb = time.perf_counter(), time.process_time()
        now += 0.001
        await store_changed(core.apply(events, now))
        keep()  # as the service does after each batch (coordinator/heap.py)
        ack_cpu += time.process_time() - cb
        batch_s.append(time.perf_counter() - tb)
        del events
    state_after_acks = rec.state.value

    t1 = time.perf_counter()
    now += 1
    step = core.apply([(power(30.0), None)], now)  # runtime below the reserve: stop now
    await store_changed(step)
    kinds: dict[str, int] = {}
    for cmds in step.commands.values():
        for c in cmds:
            kinds[c.kind] = kinds.get(c.kind, 0) + 1
    shutdown_s = time.perf_counter() - t1

    cpu_s, rss = time.process_time() - cpu0, _rss_mib()

    kv = await bus.sagas()
    for _ in range(10):  # a listing of an R3 bucket right after the writes came back empty once
        keys = await kv.keys()
        if keys:
            break
        await asyncio.sleep(0.5)
    else:
        raise RuntimeError("the sagas bucket listed no keys after the saga was stored")
    largest = max(s["largest_written"] for s in saves)
    for key in keys:
        entry = await kv.get(key)
        largest = max(largest, len(entry.value) if entry else 0)
    await bus.close()
    return {
        "ranks": ranks,
        "nodes": len(nodes),
        "jobs": len(jobs),
        "checkpoint_requests": len(requests),
        "on_battery_to_requests_stored_s": round(detect_s, 4),
        "ack_batches": len(batch_s),
        "ack_batch_s": {
            "p50": round(statistics.median(batch_s), 4),
            "max": round(max(batch_s), 4),
            "total": round(sum(batch_s), 2),
        },
        "ack_cpu_us_per_rank": round(ack_cpu / ranks * 1e6, 1),
        "ack_decode_cpu_us_per_rank": round(decode_cpu / ranks * 1e6, 1),
        "state_after_acks": state_after_acks,
        "commands_after_drain": kinds,
        "drain_to_shutdown_commands_stored_s": round(shutdown_s, 4),
        "record_json_bytes": len(rec.model_dump_json()),
        "largest_kv_value_bytes": largest,
        "parts": saves[-1]["parts"],
        "save_bytes": {
            "p50": int(statistics.median(s["bytes_written"] for s in saves)),
            "max": max(s["bytes_written"] for s in saves),
        },
        "cpu_s": round(cpu_s, 2),
        "rss_mib": round(rss, 1),
        "idle_heap_settle_s": round(heap_settle_s, 3),
        "rss_mib_before": round(rss_base, 1),
        "rss_kib_per_rank": round((rss - rss_base) * 1024 / ranks, 2),
    }


def _acks(rec, jobs: dict[str, int]) -> list[bytes]:
    """Every rank's durable ack to its job's request in the saga ``rec``, as published (the
    payloads the coordinator's consumer decodes)."""
    from powerguard.schemas import encode

    return [
        encode(durable_ack(job, r, None, rec.jobs[job].request_id, rec.saga_id))
        for job, size in jobs.items()
        for r in range(size)
    ]


def _decoded(payloads: list[bytes]) -> list:
    """The events of a batch of payloads, as the consumer decodes them."""
    from powerguard.schemas import decode

    return [(decode(p), None) for p in payloads]


async def arrival(ranks: int, urls: list[str]) -> dict:
    """The outage whose acks arrive over one second, in a coordinator process of its own (a
    fresh one: nothing of another outage in its memory)."""
    from powerguard.coordinator.heap import settle, tune
    from powerguard.coordinator.store import SagaStore

    tune()
    site = Layout.of(ranks)
    bus = await connect(urls, "bench-arrival")
    store = SagaStore(await bus.sagas())
    settle()
    try:
        return await acks_over_one_second(site, store, time.time())
    finally:
        await bus.close()


async def acks_over_one_second(site, store, now: float) -> dict:
    """An outage as a site would see it: the UPS reports low battery
    (300 s, checkpoint then stop at once: hold policy ``continue``), every rank's ack arrives at
    an even pace over one second (wall clock), and the coordinator applies and stores what has
    arrived, batch after batch (up to its consumer's batch), as its consumer does. Measured: the
    last ack's arrival -> every ack applied and stored (``acks_applied_after_last_s``) and -> every
    node's shutdown command issued and stored (``last_ack_to_shutdowns_s``)."""
    from datetime import UTC, datetime

    from powerguard.bus.roles import INPUT_BATCH as BATCH
    from powerguard.coordinator.core import SiteCore
    from powerguard.coordinator.heap import keep
    from powerguard.coordinator.policy import Policy
    from powerguard.schemas import LowBattery, PowerData

    policy = Policy(ckpt_timeout_s=600, shutdown_reserve_s=60, margin_s=5, hold_policy="continue")
    core = SiteCore(site.topology(), policy, registry=site.registry(), saga_id=lambda site, now: "bench-low")
    data = PowerData(site="bench", ups="ups-a", on_battery=True, runtime_s=300, charge_pct=20, status=["OB", "LB"])
    step = core.apply([(LowBattery(time=datetime.fromtimestamp(now, UTC), data=data), None)], now)
    rev = await store.create(step.changed[0])
    rec = core.open["bench-low"]
    acks = _acks(rec, site.jobs)
    random.Random(2).shuffle(acks)
    n = len(acks)
    t0 = time.perf_counter()
    last_arrival = t0 + 1.0
    done = shutdowns = 0
    shutdowns_at = None
    batches = 0
    cpu0 = time.process_time()
    while done < n:
        arrived = min(n, int((time.perf_counter() - t0) * n) + 1)
        if arrived <= done:
            await asyncio.sleep((done + 1) / n - (time.perf_counter() - t0))
            continue
        take = _decoded(acks[done : min(arrived, done + BATCH)])  # decoded as they are taken
        now += 0.001
        step = core.apply(take, now)
        for changed in step.changed:
            rev = await store.save(changed, rev)
        keep()
        batches += 1
        done += len(take)
        shutdowns += sum(1 for cmds in step.commands.values() for c in cmds if c.kind == "shutdown")
        if shutdowns_at is None and shutdowns:
            shutdowns_at = time.perf_counter()
    applied = time.perf_counter()
    return {
        "arrival_s": 1.0,
        "arrival_batches": batches,
        "arrival_ack_cpu_us_per_rank": round((time.process_time() - cpu0) / n * 1e6, 1),
        "acks_applied_after_last_s": round(max(0.0, applied - last_arrival), 3),
        "last_ack_to_shutdowns_s": None if shutdowns_at is None else round(max(0.0, shutdowns_at - last_arrival), 3),
        "shutdown_commands_at_last_ack": shutdowns,
    }


def raises(ranks: int, repeats: int = 3) -> dict:
    """One job of ``ranks`` ranks, the site's policy ``require_durability: replicated``: every
    rank acks ``local``, then each rank's raise to ``replicated:1`` arrives as its own ack (the
    node tier's per-rank raise). Timed: the site core applying the raises, in the consumer's
    batches, decoded beforehand (the decoding is the bus's part, reported in the rows above);
    the best of ``repeats`` outages (a fresh core each)."""
    from datetime import UTC, datetime

    from powerguard.bus.roles import INPUT_BATCH as BATCH
    from powerguard.coordinator.core import SiteCore
    from powerguard.coordinator.policy import Policy
    from powerguard.schemas import OnBattery, PowerData

    site = Layout.of(ranks)
    ((job, size),) = site.jobs.items()
    policy = Policy(hold_policy="continue", ckpt_timeout_s=600, max_on_battery_s=3600, require_durability="replicated")
    best = None
    for _ in range(repeats):
        core = SiteCore(site.topology(), policy, registry=site.registry(), saga_id=lambda site, now: "bench-raise")
        now = time.time()
        data = PowerData(site="bench", ups="ups-a", on_battery=True, runtime_s=3000.0, charge_pct=90)
        core.apply([(OnBattery(time=datetime.fromtimestamp(now, UTC), data=data), None)], now)
        rec = core.open["bench-raise"]
        first = durable_ack(job, 0, None, rec.jobs[job].request_id, rec.saga_id)
        local = [first.model_copy(update={"data": first.data.model_copy(update={"rank": r})}) for r in range(size)]
        raised = [
            a.model_copy(update={"data": a.data.model_copy(update={"durability": "replicated:1"})}) for a in local
        ]
        for i in range(0, size, BATCH):
            now += 0.001
            core.apply([(a, None) for a in local[i : i + BATCH]], now)
        assert rec.jobs[job].settled_at is None, "settled before any raise: the requirement was not applied"
        cpu = 0.0
        for i in range(0, size, BATCH):
            batch = [(a, None) for a in raised[i : i + BATCH]]
            now += 0.001
            c0 = time.process_time()
            core.apply(batch, now)
            cpu += time.process_time() - c0
        assert rec.jobs[job].settled_at is not None, "every rank raised and the round not answered"
        best = cpu if best is None else min(best, cpu)
    return {"ranks": ranks, "replicated_raise_us_per_ack": round(best / size * 1e6, 2)}


def _child(ranks: int, urls: list[str], *phase: str) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--child", str(ranks), "--urls", ",".join(urls), *phase],
        check=True,
        capture_output=True,
        text=True,
        env=os.environ,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _late(run: dict) -> float:
    return run["acks_applied_after_last_s"]


def main() -> None:
    ap = site_args(__doc__, RESULTS)
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--urls", help=argparse.SUPPRESS)
    ap.add_argument("--arrival", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument(
        "--arrival-runs", type=int, default=3, help="outages whose acks arrive over one second, per size (median kept)"
    )
    ap.add_argument(
        "--raise-ranks",
        default="512,1024,2048,4096",
        help="job sizes for the replicated-raise cost (require_durability: replicated)",
    )
    ap.add_argument(
        "--raises-only",
        action="store_true",
        help="measure only the raise cost and update its rows in the results file",
    )
    args = ap.parse_args()
    if args.child:
        run = arrival if args.arrival else one
        print(json.dumps(asyncio.run(run(args.child, args.urls.split(",")))))
        return
    raise_rows = [raises(n) for n in (int(x) for x in args.raise_ranks.split(","))]
    raise_part = {"replicated_raises": raise_rows}
    if len(raise_rows) > 1:  # the figure: per-ack cost at the largest job over the smallest (flat: 1.0)
        raise_part["replicated_raise_growth"] = round(
            raise_rows[-1]["replicated_raise_us_per_ack"] / raise_rows[0]["replicated_raise_us_per_ack"], 2
        )
    if args.raises_only:
        print(json.dumps(raise_part, indent=1))
        # the site rows keep their own date and commit; these rows get theirs
        old = json.loads(args.out.read_text()) if args.out.exists() else stamp({"benchmark": "scale"})
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(old | raise_part | {"replicated_raises_at": stamp({})}, indent=1) + "\n")
        print(f"wrote {args.out}")
        return
    from powerguard.bus.roles import INPUT_BATCH

    rows = []
    with nats_cluster() as urls:
        for ranks in (int(x) for x in args.ranks.split(",")):
            row = _child(ranks, urls)  # each phase in a fresh process (its RSS, its heap its own)
            runs = sorted((_child(ranks, urls, "--arrival") for _ in range(args.arrival_runs)), key=_late)
            row |= runs[len(runs) // 2]  # the median run (a 2-core machine's noise: ~10 %)
            row["arrival_runs_after_last_s"] = [r["acks_applied_after_last_s"] for r in runs]
            print(json.dumps(row, indent=1))
            rows.append(row)
    result = {
        "benchmark": "scale",
        "scope": "coordinator site core + saga store on a 3-node nats-server cluster (R3 KV); "
        "fan-out to ranks over per-node connections not included",
        "per_node": PER_NODE,
        "job_ranks": JOB_RANKS,
        "batch": INPUT_BATCH,
        "sizes": rows,
        **raise_part,
    }
    cost = {row["ranks"]: row["ack_cpu_us_per_rank"] for row in rows}
    if 10_000 in cost and 100_000 in cost:  # the figure: per-rank cost at 100k over 10k (flat: 1.0)
        result["ack_cost_growth"] = round(cost[100_000] / cost[10_000], 2)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(stamp(result), indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
