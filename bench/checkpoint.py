"""Checkpoint benchmark, 2 ranks (torchrun, gloo, CPU), model + AdamW state ~1.6 GB.

Measured in one run, on one disk:
  * dd conv=fsync of the checkpoint's size                 -> disk MB/s
  * plain dcp.save                                          -> MB/s
  * CheckpointAgent.save (streaming xxh3, manifests, COMMIT) -> MB/s; ratios to dd and to plain DCP
  * periodic async save: training stall vs the synchronous save time
  * restore (verify + load) MB/s
  * guard.step() when nothing is due: µs per step
Writes bench/results/checkpoint.json. ``--size-gb`` scales the state (default 1.6).
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
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "checkpoint.json"


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from _state import barrier_timer, trained_state

    from powerguard.ckpt_agent import CheckpointAgent

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    width = 4096
    _, ddp, opt, state_bytes = trained_state(args.size_gb, width, ddp=True)
    root = Path(args.dir)
    guard = CheckpointAgent(job="bench", model=ddp, optimizer=opt, local_dir=root / "durable", local_every_s=0, keep=1)
    group = dist.new_group(backend="gloo")
    timed = barrier_timer(group)

    results: dict[str, list[float]] = {"dd_s": [], "plain_s": [], "durable_s": []}
    for rep in range(args.reps):
        if rank == 0:
            target = root / "dd.bin"
            t0 = time.perf_counter()
            subprocess.run(
                [
                    "dd",
                    "if=/dev/zero",
                    f"of={target}",
                    "bs=16M",
                    f"count={max(1, state_bytes // (16 << 20))}",
                    "conv=fsync",
                ],
                check=True,
                capture_output=True,
            )
            results["dd_s"].append(time.perf_counter() - t0)
            target.unlink()
        plain_dir = root / f"plain-{rep}"

        def plain(plain_dir: Path = plain_dir) -> None:
            from torch.distributed.checkpoint.state_dict import get_state_dict

            msd, osd = get_state_dict(ddp, opt)
            dcp.save(
                {"model": msd, "optim": osd},
                storage_writer=dcp.FileSystemWriter(plain_dir, sync_files=True),
                process_group=group,
            )

        results["plain_s"].append(timed(plain))
        if rank == 0:
            shutil.rmtree(plain_dir)
        results["durable_s"].append(timed(lambda rep=rep: guard.save(100 + rep)))

    # async periodic save: the stall seen by training vs the synchronous save, as the extra wall
    # time of the training step during which the save starts (its staging copy overlaps that
    # step's forward/backward; the optimizer step waits for the copy). The first save allocates
    # the staging buffers (once per job); the second is the steady state.
    x = torch.randn(2, width)

    def train_step() -> None:
        ddp(x).sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=False)

    def boundary_and_step(s: int) -> float:
        dist.barrier(group)
        t0 = time.perf_counter()
        guard.step(s)
        train_step()
        dist.barrier(group)
        return time.perf_counter() - t0

    base = statistics.median(boundary_and_step(150 + i) for i in range(4))
    slowdowns, blocked = [], []
    for s in (200, 202):
        guard.saver.due_now()
        boundary_and_step(s)  # rank 0 says a periodic save is due; the agreement runs during this step
        slowdowns.append(max(0.0, boundary_and_step(s + 1) - base))  # the boundary where the save starts
        # what blocked the training thread: starting the save + the optimizer step's wait for the copy
        blocked.append(guard.stats["async_stall_s"] + guard.stats.get("async_wait_s", 0.0))
        guard.wait()
    first_stall, stall = blocked
    # restore (verify + load) of the newest durable checkpoint
    restore_s = timed(guard.restore)

    # guard.step() when nothing is due, back to back (no training between: every paced agreement
    # falls due within these calls; bench/step_boundary.py measures it between real steps)
    n = args.step_iters
    dist.barrier(group)
    t0 = time.perf_counter()
    for s in range(n):
        guard.step(1000 + s)
    step_us = (time.perf_counter() - t0) / n * 1e6

    if rank == 0:
        mb = state_bytes / 1e6
        dd = statistics.median(results["dd_s"])
        plain = statistics.median(results["plain_s"])
        durable = statistics.median(results["durable_s"])
        out = {
            "ranks": dist.get_world_size(),
            "state_mb": round(mb, 1),
            "reps": args.reps,
            "dd_mb_s": round(mb / dd, 1),
            "plain_dcp_mb_s": round(mb / plain, 1),
            "durable_mb_s": round(mb / durable, 1),
            "durable_over_dd": round(dd / durable, 3),
            "durable_over_plain_dcp": round(plain / durable, 3),
            "sync_save_s": round(durable, 3),
            "async_stall_s": round(stall, 4),
            "async_step_slowdown_s": round(slowdowns[1], 4),
            "train_step_s": round(base, 4),
            "async_first_stall_s": round(first_stall, 4),
            "async_stall_over_sync": round(stall / durable, 4),
            "restore_mb_s": round(mb / restore_s, 1),
            "step_overhead_us": round(step_us, 1),
            "raw_s": {k: [round(x, 3) for x in v] for k, v in results.items()},
            "targets": {
                "durable_over_dd": ">= 0.8",
                "durable_over_plain_dcp": ">= 0.9",
                "async_stall_over_sync": "<= 0.1",
                "step_overhead_us": "<= 1000",
            },
        }
        previous = json.loads(Path(args.out).read_text()) if Path(args.out).exists() else {}
        for other in ("step_boundary", "power_checkpoint"):  # bench/step_boundary.py's, bench/power_checkpoint.py's
            if other in previous:
                out[other] = previous[other]
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    guard.close()
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--size-gb", type=float, default=1.6)
    p.add_argument("--reps", type=int, default=4)
    p.add_argument("--step-iters", type=int, default=500)
    p.add_argument("--dir", default=None, help="where to write (default: a temp dir on the project's disk)")
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="pg-bench-ckpt-", dir=Path(__file__).parent))
    try:
        cmd = [
            str(Path(sys.executable).parent / "torchrun"),
            "--standalone",
            "--nproc-per-node",
            "2",
            __file__,
            "--worker",
            "--size-gb",
            str(args.size_gb),
            "--reps",
            str(args.reps),
            "--step-iters",
            str(args.step_iters),
            "--dir",
            str(base),
            "--out",
            args.out,
        ]
        subprocess.run(cmd, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)
    r = json.loads(Path(args.out).read_text())
    print(
        f"state {r['state_mb']:.0f} MB, 2 ranks: dd {r['dd_mb_s']} MB/s, plain DCP {r['plain_dcp_mb_s']} MB/s, "
        f"durable {r['durable_mb_s']} MB/s"
    )
    print(
        f"durable/dd {r['durable_over_dd']} (>= 0.8), durable/plain DCP {r['durable_over_plain_dcp']} (>= 0.9), "
        f"async stall/sync {r['async_stall_over_sync']} (<= 0.1), restore {r['restore_mb_s']} MB/s, "
        f"step overhead {r['step_overhead_us']} us (<= 1000)"
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
