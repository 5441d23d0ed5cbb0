"""Fan-out and acks over per-node connections: N simulated ranks on N/8 nodes, one NATS
connection per node (the node's ranks behind it, as a node-level relay would hold them), spread
over a 3-node nats-server cluster (R3 stream), in 4 client processes. Every job's checkpoint
request is built by the coordinator's own code (``saga.start`` + ``command_event``) and
published by the bus client; each node answers one ack per rank to JetStream when the request
reaches it.

Measured: request published -> each node has it (p50 / max over nodes); request published ->
every ack stored by JetStream (the stream's publish acks, R3), and the ack rate. The coordinator
consuming those acks is bench/scale.py's figure. One machine's clock (time.time) throughout.

Writes bench/results/fanout.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

from _site import PER_NODE, Layout, connect, nats_cluster, site_args

RESULTS = Path(__file__).parent / "results" / "fanout.json"
PROCS = 4


async def node_clients(ranks: int, proc: int, urls: list[str], prefix: str, timeout_s: float) -> dict:
    import nats

    from powerguard.schemas import CheckpointDurable, CheckpointDurableData, decode, encode
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

    async def answer(nc, js, node: str, request) -> None:
        d = request.data
        for job, rank in on[node]:
            if job != d.job:
                continue
            ev = CheckpointDurable(
                data=CheckpointDurableData(
                    request_id=d.request_id,
                    saga_id=d.saga_id,
                    job=job,
                    rank=rank,
                    world_size=jobs[job],
                    step=1001,
                    path="/ckpt",
                    bytes=1,
                    digest="0" * 32,
                )
            )
            async with ack_slots:
                await js.publish(subjects.ckpt_ack(job, rank), encode(ev), headers={"Nats-Msg-Id": ev.id}, timeout=60)
            acked.append(time.time())
            if len(acked) == total:
                done.set()

    async def one(i: int, node: str):
        nc = await nats.connect(servers=[urls[i % len(urls)]], max_reconnect_attempts=0, connect_timeout=30)
        js = nc.jetstream()

        async def on_request(msg) -> None:
            t = time.time()
            request = decode(msg.data)
            got.setdefault(node, t)
            asyncio.get_running_loop().create_task(answer(nc, js, node, request))

        for job in sorted({j for j, _ in on[node]}):
            await nc.subscribe(subjects.ckpt_request(job), cb=on_request)
        await nc.flush()
        return nc

    conns = []
    for i in range(0, len(mine), 200):  # connect in waves
        conns += await asyncio.gather(*(one(i + k, n) for k, n in enumerate(mine[i : i + 200])))
    print("ready", flush=True)
    try:
        await asyncio.wait_for(done.wait(), timeout_s)
    except TimeoutError:
        pass
    await asyncio.gather(*(nc.close() for nc in conns), return_exceptions=True)
    return {
        "received": list(got.values()),
        "nodes": len(mine),
        "acks": len(acked),
        "acks_expected": total,
        "last_ack": max(acked) if acked else None,
    }


async def run(ranks: int, urls: list[str]) -> dict:
    from powerguard.bus import BusNames
    from powerguard.coordinator import saga
    from powerguard.coordinator.outbox import command_event
    from powerguard.coordinator.policy import Policy
    from powerguard.coordinator.saga import Tick, UpsView

    names = BusNames.isolated()
    bus = await connect(urls, "coordinator", names)
    site = Layout.of(ranks)
    nodes, jobs, reg, topo = site.nodes, site.jobs, site.registry(), site.topology()
    policy = Policy(hold_policy="continue", ckpt_timeout_s=600)
    ups = {"ups-a": UpsView(on_battery=True, runtime_s=3000.0, charge_pct=90.0)}
    rec = saga.start(saga_id="fanout", topo=topo, ups=ups, jobs=reg.jobs(), now=time.time())
    cmds = saga.handle(rec, Tick(), now=time.time(), topo=topo, policy=policy, jobs=reg.jobs())
    requests = [command_event(rec, c) for c in cmds if c.kind == "ckpt_request"]
    assert len(requests) == len(jobs), (len(requests), len(jobs))

    workers = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            __file__,
            "--worker",
            str(p),
            "--ranks",
            str(ranks),
            "--urls",
            ",".join(urls),
            "--prefix",
            names.prefix,
            stdout=asyncio.subprocess.PIPE,
        )
        for p in range(PROCS)
    ]
    t_connect = time.time()
    for w in workers:
        assert (await asyncio.wait_for(w.stdout.readline(), 600)).strip() == b"ready"
    connect_s = time.time() - t_connect
    t0 = time.time()
    await asyncio.gather(*(bus.publish(ev) for ev in requests))
    published = time.time() - t0
    outs = []
    for w in workers:
        out, _ = await w.communicate()
        outs.append(json.loads(out.decode().strip().splitlines()[-1]))
    await bus.close()
    delivery = sorted(t - t0 for o in outs for t in o["received"])
    acks = sum(o["acks"] for o in outs)
    last = max(o["last_ack"] for o in outs if o["last_ack"]) - t0
    return {
        "ranks": ranks,
        "nodes": len(nodes),
        "connections": len(nodes),
        "jobs": len(jobs),
        "connect_all_s": round(connect_s, 1),
        "requests_published_s": round(published, 4),
        "nodes_with_request": len(delivery),
        "request_to_node_s": {"p50": round(statistics.median(delivery), 4), "max": round(delivery[-1], 4)},
        "acks_stored": acks,
        "acks_expected": ranks,
        "request_to_all_acks_stored_s": round(last, 2),
        "acks_per_s": round(acks / last),
    }


def main() -> None:
    ap = site_args(__doc__, RESULTS)
    ap.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--urls", help=argparse.SUPPRESS)
    ap.add_argument("--prefix", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker is not None:
        res = asyncio.run(node_clients(int(args.ranks), args.worker, args.urls.split(","), args.prefix, 300))
        print(json.dumps(res), flush=True)
        return
    rows = []
    with nats_cluster() as urls:
        for ranks in (int(x) for x in args.ranks.split(",")):
            row = asyncio.run(run(ranks, urls))
            print(json.dumps(row), flush=True)
            rows.append(row)
    result = {
        "benchmark": "fanout",
        "per_node": PER_NODE,
        "client_processes": PROCS,
        "cores": os.cpu_count(),
        "sizes": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
