"""Fan-out and acks over per-node connections: N simulated ranks on N/8 nodes, one NATS
connection per node (the node's ranks behind it, as the node's leaf nats-server holds them: see
docs/architecture.md, "Ranks on the bus at scale"), spread over a 3-node nats-server cluster
(R3 stream and KV), in 4 client processes. The coordinator's own code runs the path: the
on_battery event goes into the site core (``SiteCore.apply``), the saga is stored in the R3 KV
bucket (``SagaStore``, split records), and every job's checkpoint request is published by the
bus client; each node answers one ack per rank to JetStream once its ranks have written their
checkpoint (``--ckpt-s``, default 1 s: a real DCP save takes seconds; 0: the acks go out at once
and their traffic competes with the fan-out on this machine's 2 cores).

Measured: on_battery -> each node has its request (p50 / max over nodes, the coordinator's
apply and store included); request published -> each node has it; request published -> every
ack stored by JetStream (R3), and the ack rate. Then the outage end to end (``--follow-ranks``):
the UPS reports low battery (checkpoint, then stop at once), each node's acks go out after a 1 s
checkpoint plus a share of ``--follow-spread-s`` of its own (the acks arrive over a second, as real
ranks' do), and the coordinator's own consumer follows them as its service does (bench/_follow.py:
the durable, batch and filter of the service, the site core, the record stored before its states
and commands are published): the last ack stored by JetStream -> every ack applied and the record
stored, -> every node's shutdown command in the stored record, -> those commands stored by
JetStream (power-control's input). bench/scale.py measures the coordinator's part alone. One
machine's clock (time.time) throughout. The servers fsync every
write (``sync_interval: always``, what PowerGuard ships); ``--sync-ranks`` runs one size again
with it and with NATS's default (2 minutes), side by side in the same run: the durability's cost.

Writes bench/results/fanout.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import time
from pathlib import Path

from _provenance import stamp, write
from _site import PER_NODE, Layout, client_processes, connect, durable_ack, nats_cluster, site_args

RESULTS = Path(__file__).parent / "results" / "fanout.json"
PROCS = 4


def ack_events(on_node: list[tuple[str, int]], jobs: dict[str, int], raw: bytes, job_acks: bool) -> list:
    """The durable acks of a node's ranks of the request's job (what each rank's agent sends);
    ``job_acks``: rank 0's one ack for the job (the request asks for it), from its node alone."""
    from powerguard.schemas import decode

    d = decode(raw).data
    if job_acks:
        if (d.job, 0) not in on_node:
            return []
        return [durable_ack(d.job, 0, jobs[d.job], d.request_id, d.saga_id, for_job=True)]
    return [durable_ack(job, rank, jobs[job], d.request_id, d.saga_id) for job, rank in on_node if job == d.job]


def _ckpt_time(node: str, ckpt_s: float, spread_s: float) -> float:
    """How long the node's ranks take to write their checkpoint: ``ckpt_s``, plus a share of
    ``spread_s`` of its own (the same node, the same share), so the acks arrive over ``spread_s``."""
    return ckpt_s + spread_s * random.Random(node).random()


async def wire_clients(
    ranks: int,
    proc: int,
    urls: list[str],
    prefix: str,
    timeout_s: float,
    ckpt_s: float,
    spread_s: float = 0.0,
    job_acks: bool = False,
) -> dict:
    """This process's nodes as protocol-level connections (bench/_wire.py). ``job_acks``: each
    job's rank 0 acks for the job once every node of the job wrote (as its COMMIT waits for every
    rank), one message; otherwise each node one ack per rank once its own ranks wrote."""
    from _wire import connect_node

    from powerguard.schemas import encode
    from powerguard.schemas.subjects import Subjects

    subjects = Subjects(prefix)
    site = Layout.of(ranks)
    mine = site.nodes[proc::PROCS]
    got: dict[str, float] = {}
    acked: list[float] = []
    done = asyncio.Event()
    total = sum(len(site.on[n]) for n in mine)  # ack messages this process sends
    job_nodes: dict[str, set[str]] = {}
    for n, on in site.on.items():
        for j, _ in on:
            job_nodes.setdefault(j, set()).add(n)
    if job_acks:
        total = sum(1 for n in mine for j, r in site.on[n] if r == 0)
    nodes_in_flight = asyncio.Semaphore(256)  # 8 acks each: ~2,048 publishes in flight, as with nats.py
    conns = {}
    answering: set[asyncio.Task] = set()

    async def answer(node: str, raw: bytes) -> None:
        evs = ack_events(site.on[node], site.jobs, raw, job_acks)
        if not evs:
            return
        # the node's ranks write their checkpoint (for the job: every node of it, the slowest last)
        writers = job_nodes[evs[0].data.job] if job_acks else (node,)
        await asyncio.sleep(max(_ckpt_time(n, ckpt_s, spread_s) for n in writers))
        msgs = [(subjects.ckpt_ack(e.data.job, e.data.rank), e.id, encode(e)) for e in evs]
        async with nodes_in_flight:
            await conns[node].publish_acks(msgs, 60)
        acked.extend([time.time()] * conns[node].stored)
        if len(acked) >= total:
            done.set()

    def receiver(node: str):
        def on_msg(raw: bytes) -> None:
            got.setdefault(node, time.time())
            task = asyncio.get_running_loop().create_task(answer(node, raw))
            answering.add(task)
            task.add_done_callback(answering.discard)

        return on_msg

    for i in range(0, len(mine), 200):  # connect in waves
        wave = mine[i : i + 200]
        made = await asyncio.gather(
            *(
                connect_node(
                    urls[(i + k) % len(urls)],
                    node,
                    [subjects.ckpt_request(j) for j in sorted({j for j, _ in site.on[node]})],
                    receiver(node),
                )
                for k, node in enumerate(wave)
            )
        )
        conns.update(zip(wave, made, strict=True))
    print("ready", flush=True)
    if total == 0:  # one ack per job, and no job's rank 0 on this process's nodes: nothing to send
        done.set()
    await _wait(done, timeout_s)
    for c in conns.values():
        c.close()
    errors = [e for c in conns.values() for e in c.errors]
    return _outcome(got, len(mine), acked, total) | {"errors": errors[:5]}


async def node_clients(
    ranks: int, proc: int, urls: list[str], prefix: str, timeout_s: float, ckpt_s: float, spread_s: float = 0.0
) -> dict:
    import nats

    from powerguard.schemas import encode
    from powerguard.schemas.subjects import Subjects

    subjects = Subjects(prefix)
    site = Layout.of(ranks)
    jobs, on = site.jobs, site.on
    mine = site.nodes[proc::PROCS]
    got: dict[str, float] = {}
    acked: list[float] = []
    done = asyncio.Event()
    total = sum(len(on[n]) for n in mine)
    ack_slots = asyncio.Semaphore(2048)

    async def answer(nc, js, node: str, raw: bytes) -> None:
        # the node's ranks write their checkpoint; on a real site each node reads and decodes its
        # request on its own CPU, here 3,125 nodes share one process: decoding after the write
        # keeps one node's decode from delaying the next node's delivery (with --ckpt-s 0 it does)
        await asyncio.sleep(_ckpt_time(node, ckpt_s, spread_s))
        for ev in ack_events(on[node], jobs, raw, False):
            async with ack_slots:
                await js.publish(
                    subjects.ckpt_ack(ev.data.job, ev.data.rank), encode(ev), headers={"Nats-Msg-Id": ev.id}, timeout=60
                )
            acked.append(time.time())
            if len(acked) == total:
                done.set()

    async def one(i: int, node: str):
        nc = await nats.connect(servers=[urls[i % len(urls)]], max_reconnect_attempts=0, connect_timeout=30)
        js = nc.jetstream()

        async def on_request(msg) -> None:
            got.setdefault(node, time.time())
            asyncio.get_running_loop().create_task(answer(nc, js, node, msg.data))

        for job in sorted({j for j, _ in on[node]}):
            await nc.subscribe(subjects.ckpt_request(job), cb=on_request)
        await nc.flush()
        return nc

    conns = []
    for i in range(0, len(mine), 200):  # connect in waves
        conns += await asyncio.gather(*(one(i + k, n) for k, n in enumerate(mine[i : i + 200])))
    print("ready", flush=True)
    await _wait(done, timeout_s)
    await asyncio.gather(*(nc.close() for nc in conns), return_exceptions=True)
    return _outcome(got, len(mine), acked, total)


async def _wait(done: asyncio.Event, timeout_s: float) -> None:
    """Until every ack of this process is stored, or the time is up (the figures say how many)."""
    try:
        await asyncio.wait_for(done.wait(), timeout_s)
    except TimeoutError:
        pass


def _outcome(got: dict[str, float], nodes: int, acked: list[float], total: int) -> dict:
    """One client process's figures, as the parent reads them."""
    return {
        "received": list(got.values()),
        "nodes": nodes,
        "acks": len(acked),
        "acks_expected": total,
        "first_ack": min(acked) if acked else None,
        "last_ack": max(acked) if acked else None,
    }


CLIENTS = {"wire": wire_clients, "nats.py": node_clients}


async def run(
    ranks: int,
    urls: list[str],
    ckpt_s: float,
    client: str,
    *,
    spread_s: float = 0.0,
    follow: bool = False,
    acks: str = "rank",
) -> dict:
    """One outage over per-node connections. ``follow``: the UPS reports low battery (checkpoint,
    then stop at once) and the coordinator's consumer follows the acks to the shutdown commands
    (bench/_follow.py), the acks arriving over ``spread_s``. ``acks``: ``rank``, one ack per rank
    (an agent that does not take the request's ``acks: job``), or ``job``: rank 0's one ack per job."""
    from datetime import UTC, datetime

    from _follow import Followed, Follower

    from powerguard.bus import BusNames
    from powerguard.coordinator.core import SiteCore
    from powerguard.coordinator.heap import settle, tune
    from powerguard.coordinator.outbox import command_event
    from powerguard.coordinator.policy import Policy
    from powerguard.coordinator.store import SagaStore
    from powerguard.schemas import CheckpointRequested, LowBattery, OnBattery, PowerData

    if follow:
        tune()  # the collector's thresholds the coordinator's process runs with (its consumer in this one)
    names = BusNames.isolated()
    bus = await connect(urls, "coordinator", names)
    store = SagaStore(await bus.sagas())
    site = Layout.of(ranks)
    nodes, jobs = site.nodes, site.jobs
    if follow:  # as bench/scale.py's outage whose acks arrive over one second
        policy = Policy(ckpt_timeout_s=600, shutdown_reserve_s=60, margin_s=5, hold_policy="continue")
    else:
        policy = Policy(hold_policy="continue", ckpt_timeout_s=600, max_on_battery_s=3600)
    core = SiteCore(site.topology(), policy, registry=site.registry(), saga_id=lambda site, now: "fanout")
    revisions: dict[str, int] = {}
    followed = Followed(expected=ranks, nodes=len(nodes))
    follower = Follower(bus, core, store, revisions, followed, "bench")

    split: dict[str, float] = {}

    async def on_battery() -> list:
        """What the coordinator does with the event: apply, store the saga, then the requests."""
        now = time.time()
        t = time.perf_counter()
        if follow:
            low = ["OB", "LB"]
            data = PowerData(site="bench", ups="ups-a", on_battery=True, runtime_s=300, charge_pct=20, status=low)
            event = LowBattery(time=datetime.fromtimestamp(now, UTC), data=data)
        else:
            data = PowerData(site="bench", ups="ups-a", on_battery=True, runtime_s=3000.0, charge_pct=90)
            event = OnBattery(time=datetime.fromtimestamp(now, UTC), data=data)
        step = core.apply([(event, None)], now)
        split["apply_s"] = round(time.perf_counter() - t, 4)
        for rec in step.changed:
            revisions[rec.saga_id] = await store.create(rec)
        split["store_s"] = round(time.perf_counter() - t - split["apply_s"], 4)
        return [command_event(core.open[sid], c) for sid, cmds in step.commands.items() for c in cmds]

    workers = await client_processes(
        __file__,
        PROCS,
        *("--ranks", str(ranks), "--urls", ",".join(urls), "--prefix", names.prefix),
        *("--ckpt-s", str(ckpt_s), "--spread-s", str(spread_s), "--client", client, "--acks", acks),
    )
    t_connect = time.time()
    for w in workers:
        assert (await asyncio.wait_for(w.stdout.readline(), 600)).strip() == b"ready"
    connect_s = time.time() - t_connect
    heap_settle_s = settle()  # what the idle coordinator does every minute (coordinator/heap.py)
    t_event = time.time()
    requests = [ev for ev in await on_battery() if isinstance(ev, CheckpointRequested)]
    assert len(requests) == len(jobs), (len(requests), len(jobs))
    if follow:
        await follower.start(policy)
    t0 = time.time()
    await asyncio.gather(*(bus.publish(ev) for ev in requests))
    published = time.time() - t0
    outs = []
    for w in workers:
        out, _ = await w.communicate()
        outs.append(json.loads(out.decode().strip().splitlines()[-1]))
    if follow:
        try:
            await asyncio.wait_for(followed.done.wait(), FOLLOW_TIMEOUT_S)
        except TimeoutError:
            raise SystemExit(
                f"fanout: the coordinator applied {followed.applied:,} of {ranks:,} acks and published "
                f"{followed.shutdowns_published:,} of {len(nodes):,} shutdown commands within {FOLLOW_TIMEOUT_S:.0f}s "
                "of the last ack stored"
            ) from None
        finally:
            await follower.stop()
    await bus.close()
    delivery = sorted(t - t0 for o in outs for t in o["received"])
    end_to_end = sorted(t - t_event for o in outs for t in o["received"])
    n_acks = sum(o["acks"] for o in outs)
    last_ack = max(o["last_ack"] for o in outs if o["last_ack"])
    first_ack = min(o["first_ack"] for o in outs if o.get("first_ack"))
    last = last_ack - t0
    row = {
        "ranks": ranks,
        "nodes": len(nodes),
        "connections": len(nodes),
        "node_client": client,
        "jobs": len(jobs),
        "connect_all_s": round(connect_s, 1),
        "ckpt_s": ckpt_s,
        "on_battery_to_requests_published_s": round(t0 - t_event + published, 4),
        "coordinator_s": split,
        "idle_heap_settle_s": round(heap_settle_s, 3),
        "on_battery_to_node_s": {"p50": round(statistics.median(end_to_end), 4), "max": round(end_to_end[-1], 4)},
        "requests_published_s": round(published, 4),
        "nodes_with_request": len(delivery),
        "request_to_node_s": {"p50": round(statistics.median(delivery), 4), "max": round(delivery[-1], 4)},
        "acks": acks,  # rank: one ack message per rank; job: rank 0's one per job (counts below in messages)
        "acks_stored": n_acks,
        "acks_expected": ranks if acks == "rank" else len(jobs),
        "request_to_all_acks_stored_s": round(last, 2),
        "request_to_all_acks_stored_less_ckpt_s": round(last - ckpt_s, 2),
        "acks_per_s": round(n_acks / max(last - ckpt_s, 1e-3)),
        "client_errors": [e for o in outs for e in o.get("errors", [])][:5],
    }
    if follow:
        row |= {
            "ack_spread_s": spread_s,
            "first_to_last_ack_stored_s": round(last_ack - first_ack, 2),
            "coordinator": followed.figures(last_ack),
        }
    return row


FOLLOW_TIMEOUT_S = 120.0


def _median_run(runs: list[dict]) -> dict:
    """The run whose last ack -> shutdown commands stored is the median, with every run's figure."""
    late = sorted(runs, key=lambda r: r["coordinator"]["last_ack_to_shutdowns_s"] or 1e9)
    row = late[(len(late) - 1) // 2]
    return row | {"runs_last_ack_to_shutdowns_s": [r["coordinator"]["last_ack_to_shutdowns_s"] for r in runs]}


def main() -> None:
    ap = site_args(__doc__, RESULTS)
    ap.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--urls", help=argparse.SUPPRESS)
    ap.add_argument("--prefix", help=argparse.SUPPRESS)
    ap.add_argument(
        "--ckpt-s",
        default="1,0",
        help="comma-separated simulated checkpoint write times before the acks, a row each (default: 1,0)",
    )
    ap.add_argument(
        "--client",
        default="wire",
        help="how the simulated nodes connect, comma-separated for a row each: wire (protocol-level "
        "connections, bench/_wire.py; default) or nats.py",
    )
    ap.add_argument(
        "--sync-ranks",
        type=int,
        default=10000,
        help="then this many ranks (wire client) with the broker's sync_interval always and NATS's default, "
        "side by side in the same run (0: skip)",
    )
    ap.add_argument(
        "--follow-ranks",
        default="10000,100000",
        help="then these sizes (wire client) as an outage that ends in a shutdown, the coordinator's consumer "
        "following the acks to every node's shutdown command (comma-separated; empty: skip)",
    )
    ap.add_argument(
        "--follow-spread-s",
        type=float,
        default=1.0,
        help="those outages' acks arrive over this many seconds, after a 1 s checkpoint (default: 1)",
    )
    ap.add_argument(
        "--follow-acks",
        default="rank,job",
        help="those outages' acks, a row each: rank (one ack per rank, as an agent that does not take the "
        "request's one-ack-per-job) and/or job (rank 0's one ack for its job) (default: rank,job)",
    )
    ap.add_argument(
        "--follow-runs",
        type=int,
        default=3,
        help="each of those outages this many times; the run with the median last ack -> shutdowns is kept, "
        "every run's figure beside it (default: 3)",
    )
    ap.add_argument("--spread-s", type=float, default=0.0, help=argparse.SUPPRESS)
    ap.add_argument("--acks", default="rank", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker is not None:
        clients = CLIENTS[args.client]
        urls = args.urls.split(",")
        job = {"job_acks": True} if args.acks == "job" else {}
        if job and args.client != "wire":
            raise SystemExit("fanout: one ack per job is simulated by the wire client only")
        res = asyncio.run(
            clients(int(args.ranks), args.worker, urls, args.prefix, 300, float(args.ckpt_s), args.spread_s, **job)
        )
        print(json.dumps(res), flush=True)
        return
    before = json.loads(args.out.read_text()) if args.out.exists() else {}
    rows = []
    if not args.ranks:  # --ranks "": the sizes already in --out stay (each row says when it was measured)
        rows = before.get("sizes", [])
    follow_rows = [] if args.follow_ranks else before.get("coordinator_follows", [])  # empty: those in --out stay
    with nats_cluster() as urls:
        for ranks in (int(x) for x in args.ranks.split(",") if x):
            for client in args.client.split(","):
                for ckpt_s in (float(x) for x in args.ckpt_s.split(",")):
                    row = stamp(asyncio.run(run(ranks, urls, ckpt_s, client)))
                    print(json.dumps(row), flush=True)
                    rows.append(row)
        for ranks in (int(x) for x in args.follow_ranks.split(",") if x):
            for acks in args.follow_acks.split(","):
                runs = []
                for _ in range(args.follow_runs):
                    row = run(ranks, urls, 1.0, "wire", spread_s=args.follow_spread_s, follow=True, acks=acks)
                    runs.append(asyncio.run(row))
                    print(json.dumps(runs[-1]), flush=True)
                follow_rows.append(stamp(_median_run(runs)))
    sync_rows = [] if args.sync_ranks else before.get("sync_side_by_side", [])  # 0: those in --out stay
    if args.sync_ranks:  # the broker's durability setting, side by side in one run
        for sync in ("always", None):
            with nats_cluster(sync=sync) as urls:
                for ckpt_s in (float(x) for x in args.ckpt_s.split(",")):
                    row = stamp(asyncio.run(run(args.sync_ranks, urls, ckpt_s, "wire")))
                    row["broker_sync_interval"] = sync or "2m (NATS's default)"
                    print(json.dumps(row), flush=True)
                    sync_rows.append(row)
    result = {
        "benchmark": "fanout",
        "per_node": PER_NODE,
        "client_processes": PROCS,
        "cores": os.cpu_count(),
        "broker_sync_interval": "always",
        "sizes": rows,
        "sync_side_by_side": sync_rows,
        "coordinator_follows": follow_rows,
    }
    write(result, args.out)


if __name__ == "__main__":
    main()
