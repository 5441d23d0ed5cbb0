"""Node-local tier benchmark: 3 simulated nodes x 1 rank (one torchrun per node on loopback,
gloo over TCP), a DDP model + AdamW state (default ~0.4 GB), in one run:

  * save to one shared directory vs to each node's own directory (``local_scope="node"``),
    same state, same disk: seconds (median of --reps), and the bytes each node received
  * restore from the node's own disk, from peers (one node's disk wiped), from the remote tier
    (every node's disk wiped; ``file://`` on the same disk)

All three "nodes" share this machine's disk and loopback, so the node-local figures carry the
network copy at memory speed and the disk's write bandwidth three times: on real nodes each
NVMe writes in parallel and the copy runs at the interconnect's speed. Writes
bench/results/node_tier.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "node_tier.json"
NODES = ("n0", "n1", "n2")
REPLICATED_S = 120.0  # the bound on the wait for the newest checkpoint's replicas


def worker(args: argparse.Namespace) -> None:
    import torch.distributed as dist
    from _state import barrier_timer, trained_state

    from powerguard.ckpt_agent import CheckpointAgent
    from powerguard.ckpt_agent import _layout as L

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    node = NODES[rank]
    _, ddp, opt, state_bytes = trained_state(args.size_gb, 2048, ddp=True)
    base = Path(args.dir)
    common = {"model": ddp, "optimizer": opt, "local_every_s": 0, "keep": 1}
    shared = CheckpointAgent(job="bench", local_dir=base / "shared", **common)
    remote = f"file://{base / 'nas'}"
    own = base / "disks" / node
    local = CheckpointAgent(
        job="bench", local_dir=own, local_scope="node", node=node, remote_url=remote, remote_every_s=0, **common
    )
    group = dist.new_group(backend="gloo")
    timed = barrier_timer(group)

    t_shared, t_node, saved = [], [], []
    for i in range(args.reps):
        t_shared.append(timed(lambda i=i: shared.save(10 + i)))
        t_node.append(timed(lambda i=i: saved.append(local.save(10 + i))))
    step = 10 + args.reps - 1
    files = sorted((own / "bench" / f"step-{step}").glob("*.distcp"))
    mine = own / "bench" / f"step-{step}" / f"__{rank}_0.distcp"
    received = sum(f.stat().st_size for f in files if f != mine)
    checkpoint_mb = round(sum(f.stat().st_size for f in files) / 1e6)
    # the newest checkpoint's replicas still arrive in the background: the remote tier's copy
    # takes every file the checkpoint names (it refuses a copy without one), so it waits for them
    if not local.wait_replicated(REPLICATED_S):
        raise SystemExit(f"rank {rank}: step {step}'s replication to the peers did not end in {REPLICATED_S:.0f} s")
    if local.replicated is not None and not local.replicated[1]:
        raise SystemExit(f"rank {rank}: step {step}'s replication incomplete: {local.replicated[2]}")
    if rank == 0 and local._remote is not None:  # the remote tier gets the newest checkpoint
        local._remote.copy(step)
    t_own = timed(local.restore)
    if rank == 1:
        shutil.rmtree(own)
    t_peer = timed(local.restore)
    source_peer = local.progress.restored
    shutil.rmtree(own, ignore_errors=True)
    t_remote = timed(local.restore)
    source_remote = local.progress.restored
    got: list = [None] * dist.get_world_size()
    tiers = (source_peer and source_peer.tier, source_remote and source_remote.tier)
    dist.all_gather_object(got, (received, *tiers), group=group)
    _, source_peer, source_remote = got[1]  # as the wiped node saw it
    got = [g[0] for g in got]
    if rank == 0:
        mb = state_bytes / 1e6
        r = {
            "nodes": len(NODES),
            "ranks_per_node": 1,
            "state_mb": round(mb),
            "reps": args.reps,
            "save_shared_s": round(statistics.median(t_shared), 3),
            "save_node_local_s": round(statistics.median(t_node), 3),
            "node_local_over_shared": round(statistics.median(t_node) / statistics.median(t_shared), 2),
            "received_mb_per_node": [round(x / 1e6) for x in got],
            "durability": saved[-1].durability,
            "restore_own_disk_s": round(t_own, 3),
            "restore_from_peers_s": round(t_peer, 3),
            "restore_from_remote_s": round(t_remote, 3),
            "restore_sources": {
                "peer": source_peer,
                "remote": source_remote,
            },
            "raw_s": {"shared": [round(x, 3) for x in t_shared], "node_local": [round(x, 3) for x in t_node]},
            "checkpoint_mb": checkpoint_mb,
            "layout": L.FORMAT,
        }
        Path(args.out).write_text(json.dumps(r, indent=2) + "\n")
    for a in (shared, local):
        a.close()
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--size-gb", type=float, default=0.4, help="model + AdamW state (default 0.4)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--dir", default=None, help="where to write (default: a temp dir on the project's disk)")
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="pg-bench-nodes-", dir=Path(__file__).parent))
    port = _free_port()
    try:
        procs = [
            subprocess.Popen(
                [
                    str(Path(sys.executable).parent / "torchrun"),
                    f"--nnodes={len(NODES)}",
                    f"--node-rank={i}",
                    "--nproc-per-node=1",
                    "--master-addr=127.0.0.1",
                    f"--master-port={port}",
                    __file__,
                    "--worker",
                    f"--size-gb={args.size_gb}",
                    f"--reps={args.reps}",
                    f"--dir={base}",
                    f"--out={args.out}",
                ],
                env={**os.environ, "OMP_NUM_THREADS": "1"},
            )
            for i in range(len(NODES))
        ]
        codes = [p.wait() for p in procs]
        if any(codes):
            raise SystemExit(f"a node's benchmark failed: {codes}")
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)
    r = json.loads(Path(args.out).read_text())
    print(
        f"state {r['state_mb']} MB, {r['nodes']} nodes: save shared {r['save_shared_s']} s, node-local "
        f"{r['save_node_local_s']} s ({r['node_local_over_shared']}x; each node received "
        f"{r['received_mb_per_node']} MB; {r['durability']})"
    )
    print(
        f"restore: own disk {r['restore_own_disk_s']} s, from peers {r['restore_from_peers_s']} s, "
        f"from the remote tier {r['restore_from_remote_s']} s"
    )
    print(f"wrote {args.out}")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    main()
