"""What the agent costs a sharded job's training step: DDP, FSDP2 (``fully_shard``) and tensor
parallel (DTensor), at 2 and 4 ranks (torchrun on this machine, gloo, CPU). In one run, blocks
of --block steps alternate with and without ``guard.step()`` (the agent exists in both: its
threads run either way), so the machine's drift hits both alike. Per rank: the whole step
(zero_grad, forward, backward, optimizer step, and ``guard.step()`` in the blocks with it) and
the time inside ``guard.step()``; reported: the median over ranks of each rank's p50.

Writes bench/results/sharded_step.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # its helpers, as when it runs as a script
from _torchrun import parser, workers

RESULTS = Path(__file__).parent / "results" / "sharded_step.json"
SHARDS = ("ddp", "fsdp", "tp")


def _model(shard: str):
    import torch.distributed as dist
    from torch import nn

    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 256))
    if shard == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(model)
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    if shard == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for layer in (model[0], model[2]):
            fully_shard(layer, mesh=mesh)
        return fully_shard(model, mesh=mesh)
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    return parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from powerguard.ckpt_agent import CheckpointAgent

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = _model(args.shard)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    guard = CheckpointAgent(job="bench", model=model, optimizer=opt, local_dir=args.dir, local_every_s=0)
    x = torch.randn(32, 256)
    with_agent, without, inside = [], [], []
    for step in range(args.steps):
        on = (step // args.block) % 2 == 1
        t0 = time.perf_counter()
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
        if on:
            t1 = time.perf_counter()
            guard.step(step)
            inside.append(time.perf_counter() - t1)
        (with_agent if on else without).append(time.perf_counter() - t0)
    skip = args.block  # the first block warms up (the groups connect)
    mine = tuple(statistics.median(v[skip // 2 :]) for v in (with_agent, without, inside))
    got: list = [None] * dist.get_world_size()
    dist.all_gather_object(got, mine)
    if dist.get_rank() == 0:
        step_with, step_without, blocks = (statistics.median(g[i] for g in got) for i in range(3))
        Path(args.out).write_text(
            json.dumps(
                {
                    "step_with_agent_ms": round(step_with * 1e3, 3),
                    "step_without_agent_ms": round(step_without * 1e3, 3),
                    "with_over_without": round(step_with / step_without, 3),
                    "guard_step_p50_us": round(blocks * 1e6, 1),
                }
            )
        )
    guard.close()
    dist.destroy_process_group()


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--shard", choices=SHARDS, default="ddp", help=argparse.SUPPRESS)
    p.add_argument("--ranks", default="2,4", help="world sizes (default 2,4)")
    p.add_argument("--shards", default=",".join(SHARDS), help=f"which of {', '.join(SHARDS)} (default: all)")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--block", type=int, default=20, help="steps per block; blocks alternate with and without")
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    rows = []
    for n in (int(x) for x in args.ranks.split(",")):
        for shard in args.shards.split(","):
            got = workers(__file__, n, f"--shard={shard}", f"--steps={args.steps}", f"--block={args.block}")
            row = {"ranks": n, "shard": shard, **got}
            print(
                f"{n} ranks {shard:>4}: step {row['step_with_agent_ms']} ms with the agent, "
                f"{row['step_without_agent_ms']} ms without (x{row['with_over_without']}); "
                f"guard.step() p50 {row['guard_step_p50_us']} us",
                flush=True,
            )
            rows.append(row)
    result = {"cores": os.cpu_count(), "steps": args.steps, "block": args.block, "runs": rows}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
