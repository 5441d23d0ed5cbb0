"""Registrations and heartbeats at scale: N ranks on N/8 nodes, one NATS connection per node
(protocol-level, bench/_wire.py, as in bench/fanout.py), in 4 client processes, against a 3-node
nats-server cluster that fsyncs every write (``sync_interval: always``, what PowerGuard ships).
The coordinator's own code follows the registry: its feed of the ``pg_agents`` bucket
(``RegistryFeed``: the watch the leader runs) filling an ``AgentRegistry``, in this process.

Each rank registers as its agent does (its record into the bucket, and the ``registered`` event
into the jobs' stream), then beats once (its record again: a heartbeat is the bucket's record
only). Measured: the first registration sent -> every rank in the coordinator's registry
(``register_all_s``), and a heartbeat round (the re-registration after a restart of the servers
is the same traffic: every rank writes its record again at its next beat) -> every rank heard
by the coordinator (``heartbeat_round_s``), with the rate each is written at. ``--compare-disk``
runs the same size again with the layout before this release (the bucket on disk, each heartbeat
also a stored event), side by side in the same run: what moving the soft state off the fsync path
bought. At 100,000 ranks beating every 5 s a site writes 20,000 heartbeats a second: the round's
rate says whether the servers keep up (``heartbeats_per_s_needed``).

This machine runs the three servers, the coordinator's feed and the clients on its 2 cores, so
the round's rate is this machine's, not a site's. Each round also measures the CPU it cost: the
servers' (each, read from /proc; the busiest is the stream's leader), the coordinator feed's (this
process) and the clients' (what a site's ranks spend on their own nodes; their records are built
before the round, as a rank builds its own). From those, the rate a site sustains with one core
for each server and one for the coordinator (``heartbeats_per_s_one_core_each``: a million over
the busier one's microseconds per beat).

Writes bench/results/registrations.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from pathlib import Path

from _provenance import write
from _site import PER_NODE, Layout, client_processes, connect, cpu_s, nats_servers, site_args

RESULTS = Path(__file__).parent / "results" / "registrations.json"
PROCS = 4
HEARTBEAT_S = 5.0  # the ckpt-agent's default


def _records(node: str, on_node: list[tuple[str, int]], jobs: dict[str, int], prefix: str, agents: str, kind: str):
    """What a node's ranks write for one registration or heartbeat: (subject, msg id, payload)."""
    from powerguard.schemas import AgentData, AgentHeartbeat, AgentRegistered, encode
    from powerguard.schemas.subjects import Subjects

    subjects = Subjects(prefix)
    out = []
    for job, rank in on_node:
        data = AgentData(job=job, rank=rank, world_size=jobs[job], node=node, pid=os.getpid(), step=1000)
        record = data.model_dump_json().encode()
        out.append((f"$KV.{agents}.{job}.{node}.{rank}", uuid.uuid4().hex, record))
        if kind == "register":
            event = AgentRegistered(source=f"/bench/{job}/{rank}", data=data)
        elif kind == "disk-heartbeat":  # the layout before: a heartbeat was also a stored event
            event = AgentHeartbeat(source=f"/bench/{job}/{rank}", data=data)
        else:
            continue
        out.append((subjects.agent(job, rank), event.id, encode(event)))
    return out


async def client(ranks: int, proc: int, urls: list[str], prefix: str, agents: str, disk: bool) -> None:
    """This process's nodes: connect, then per line read from stdin (``register`` or ``beat``)
    write every rank's records, pipelined per node, and print how many were stored."""
    from _wire import connect_node

    site = Layout.of(ranks)
    mine = site.nodes[proc::PROCS]
    conns = {}
    for i in range(0, len(mine), 200):  # connect in waves
        wave = mine[i : i + 200]
        made = await asyncio.gather(
            *(connect_node(urls[(i + k) % len(urls)], node, [], lambda _raw: None) for k, node in enumerate(wave))
        )
        conns.update(zip(wave, made, strict=True))
    # each rank's records built before the round: a site's ranks build theirs on their own nodes,
    # and here the clients share the servers' 2 cores (what they still spend is measured apart)
    kinds = ("register", "disk-heartbeat" if disk else "heartbeat")

    def build(kind: str) -> dict[str, list]:
        return {n: _records(n, site.on[n], site.jobs, prefix, agents, kind) for n in mine}

    built = {k: build(k) for k in kinds}
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    in_flight = asyncio.Semaphore(256)  # nodes writing at once (8 ranks each)

    async def write(node: str, msgs: list) -> None:
        async with in_flight:
            await conns[node].publish_acks(msgs, 120)

    while line := (await reader.readline()).decode().strip():
        kind = kinds[0] if line == "register" else kinds[1]
        # a second round of a kind is built anew (new message ids: the servers drop a repeated one)
        todo = built.pop(kind, None) or build(kind)
        before = sum(c.stored for c in conns.values())
        t, cpu = time.time(), time.process_time()
        await asyncio.gather(*(write(n, todo[n]) for n in mine))
        stored = sum(c.stored for c in conns.values()) - before
        errors = [e for c in conns.values() for e in c.errors][:3]
        out = {"stored": stored, "first_sent": t, "done": time.time(), "cpu_s": time.process_time() - cpu}
        print(json.dumps({**out, "errors": errors}), flush=True)
    for c in conns.values():
        c.close()


async def run(ranks: int, servers: list, *, disk: bool, timeout_s: float) -> dict:
    from nats.js import api

    from powerguard.bus import BusNames
    from powerguard.coordinator.registry_feed import RegistryFeed
    from powerguard.coordinator.topology import AgentRegistry

    urls, pids = [n.url for n in servers], [n.pid for n in servers]
    names = BusNames.isolated()
    bus = await connect(urls, "coordinator", names)
    if disk:  # the layout before this release: the registry's bucket on disk
        await bus.js.delete_stream(f"KV_{names.agents}")
        await bus.js.create_key_value(
            api.KeyValueConfig(bucket=names.agents, history=1, ttl=30, storage=api.StorageType.FILE, replicas=3)
        )
    registry = AgentRegistry()
    counts = {"records": 0, "heard": 0}
    keys: set[str] = set()
    heard: set[str] = set()
    changed = asyncio.Event()

    def on_agent(agent, key, _at, stored) -> None:
        counts["records"] += 1
        if agent is not None:
            registry.update(agent, time.time(), heard=not stored)
            keys.add(key)
            if not stored:
                heard.add(key)
        changed.set()

    feed = RegistryFeed(bus, on_agent)
    await feed.start(time.time())
    args = ["--urls", ",".join(urls), "--prefix", names.prefix, "--agents", names.agents, "--ranks", str(ranks)]
    workers = await client_processes(__file__, PROCS, *args, *(["--disk"] if disk else []), stdin=True)
    try:
        for w in workers:
            line = await asyncio.wait_for(w.stdout.readline(), 600)
            if line.strip() != b"ready":
                raise RuntimeError(f"a client process did not connect its nodes: {line!r}")

        async def round_of(what: str, done) -> dict:
            servers_before, own_before = cpu_s(pids), time.process_time()
            for w in workers:
                w.stdin.write(f"{what}\n".encode())
                await w.stdin.drain()
            outs = [json.loads(await asyncio.wait_for(w.stdout.readline(), timeout_s)) for w in workers]
            deadline = time.monotonic() + timeout_s
            while not done():
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"{what}: the coordinator's registry has {len(keys)} ranks, {len(heard)} heard, of {ranks} "
                        f"after {timeout_s:g}s (stored by the servers: {sum(o['stored'] for o in outs)})"
                    )
                changed.clear()
                try:
                    await asyncio.wait_for(changed.wait(), 1.0)
                except TimeoutError:
                    pass
            t0 = min(o["first_sent"] for o in outs)
            servers_cpu = [after - before for before, after in zip(servers_before, cpu_s(pids), strict=True)]
            return {
                "servers_cpu_s": servers_cpu,
                "coordinator_cpu_s": time.process_time() - own_before,
                "clients_cpu_s": sum(o["cpu_s"] for o in outs),
                "stored": sum(o["stored"] for o in outs),
                "written_s": round(max(o["done"] for o in outs) - t0, 2),
                "in_registry_s": round(time.time() - t0, 2),
                "errors": [e for o in outs for e in o["errors"]][:3],
            }

        registered = await round_of("register", lambda: len(keys) >= ranks)
        beat = await round_of("beat", lambda: len(heard) >= ranks)
    finally:
        for w in workers:
            if w.returncode is None:
                w.stdin.close()
        for w in workers:
            try:
                await asyncio.wait_for(w.wait(), 30)
            except TimeoutError:
                w.kill()
        await feed.stop()
        await bus.close()
    per_rank = 2  # a record and an event a rank, or (heartbeat, disk layout) a record and an event
    beat_writes = ranks * (2 if disk else 1)
    needed = ranks / HEARTBEAT_S
    busiest = max(beat["servers_cpu_s"]) / ranks * 1e6  # the stream's leader, in practice
    coordinator = beat["coordinator_cpu_s"] / ranks * 1e6
    # what the CPU each beat costs says a site can sustain with one core for each server and one
    # for the coordinator (this machine runs the three servers, the coordinator and the clients
    # on its 2 cores): the busier of the two bounds it
    per_core = 1e6 / max(busiest, coordinator, 1e-3)
    return {
        "ranks": ranks,
        "nodes": ranks // PER_NODE,
        "layout": "bucket on disk, heartbeat events stored (before)" if disk else "bucket in memory (this release)",
        "register_all_s": registered["in_registry_s"],
        "registrations_written_s": registered["written_s"],
        "registrations_per_s": round(ranks / max(registered["in_registry_s"], 1e-3)),
        "writes_per_registration": per_rank,
        "registration_servers_cpu_us": round(sum(registered["servers_cpu_s"]) / ranks * 1e6, 1),
        "heartbeat_round_s": beat["in_registry_s"],
        "heartbeats_written_s": beat["written_s"],
        "heartbeats_per_s": round(ranks / max(beat["in_registry_s"], 1e-3)),
        "fsynced_writes_per_heartbeat": beat_writes // ranks if disk else 0,
        "heartbeats_per_s_needed": round(needed),
        "keeps_up_with_heartbeats": ranks / max(beat["in_registry_s"], 1e-3) >= needed,
        "heartbeat_servers_cpu_us": round(sum(beat["servers_cpu_s"]) / ranks * 1e6, 1),
        "heartbeat_busiest_server_cpu_us": round(busiest, 1),
        "heartbeat_coordinator_cpu_us": round(coordinator, 1),
        "heartbeat_clients_cpu_us": round(beat["clients_cpu_s"] / ranks * 1e6, 1),
        "heartbeats_per_s_one_core_each": round(per_core),
        "keeps_up_one_core_each": per_core >= needed,
        "coordinator_records": counts["records"],
        "registry_ranks": len(registry),
        "client_errors": registered["errors"] + beat["errors"],
    }


def main() -> None:
    ap = site_args(__doc__, RESULTS)
    ap.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--urls", help=argparse.SUPPRESS)
    ap.add_argument("--prefix", help=argparse.SUPPRESS)
    ap.add_argument("--agents", help=argparse.SUPPRESS)
    ap.add_argument("--disk", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument(
        "--compare-disk",
        type=int,
        default=10000,
        help="then this many ranks with the layout before this release (bucket on disk, heartbeat events "
        "stored), side by side (0: skip)",
    )
    ap.add_argument("--timeout-s", type=float, default=300.0, help="bound of each round (default: 300)")
    args = ap.parse_args()
    if args.worker is not None:
        asyncio.run(client(int(args.ranks), args.worker, args.urls.split(","), args.prefix, args.agents, args.disk))
        return
    rows = []
    sizes = [int(x) for x in args.ranks.split(",") if x]
    with nats_servers() as servers:
        for ranks in sizes:
            row = asyncio.run(run(ranks, servers, disk=False, timeout_s=args.timeout_s))
            print(json.dumps(row), flush=True)
            rows.append(row)
        if args.compare_disk:
            row = asyncio.run(run(args.compare_disk, servers, disk=True, timeout_s=args.timeout_s))
            print(json.dumps(row), flush=True)
            rows.append(row)
    write(
        {
            "benchmark": "registrations",
            "per_node": PER_NODE,
            "client_processes": PROCS,
            "cores": os.cpu_count(),
            "broker": "3-node nats-server cluster, R3, sync_interval: always",
            "heartbeat_s": HEARTBEAT_S,
            "sizes": rows,
        },
        args.out,
    )


if __name__ == "__main__":
    main()
