"""What ``guard.step()`` costs the training thread when nothing is due, at 2, 4, 8 and 16 ranks
(torchrun on this machine, gloo, CPU, a small DDP model), three ways: ``paced`` (the default:
the ranks agree about every ``agree_every_s`` = 20 ms of training, on how many steps to let pass,
and between two agreements ``step()`` counts), ``blocking`` (an all-reduce at every boundary,
``agree_every_s=0``) and ``pipelined`` (every boundary, started at one and read at the next).
Per rank, the time inside ``guard.step()`` over --steps steps; reported: the median over ranks
of each rank's p50 and mean, and the worst p99.

On this 2-core machine 8 and 16 ranks oversubscribe the cores: a blocking all-reduce then waits
for the slowest rank's scheduling, which is what the pipelined agreement takes off the step.
Writes bench/results/step_boundary.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "step_boundary.json"
MODES = ("paced-pipelined", "paced", "blocking", "pipelined")
DEFAULT_MODE = "paced-pipelined"  # what CheckpointAgent does by default


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from powerguard.ckpt_agent import CheckpointAgent

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    guard = CheckpointAgent(
        job="bench",
        model=model,
        optimizer=opt,
        local_dir=args.dir,
        local_every_s=0,
        pipelined_agreement=args.mode.endswith("pipelined"),
        agree_every_s=args.agree_every_s if args.mode.startswith("paced") else 0.0,
    )
    x, y = torch.randn(8, 64), torch.randn(8, 1)
    times = []
    for step in range(args.steps):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        t0 = time.perf_counter()
        guard.step(step)
        times.append(time.perf_counter() - t0)
    times = sorted(times[10:])  # the first boundaries connect the group
    mine = (times[len(times) // 2], times[int(len(times) * 0.99)], statistics.fmean(times))
    got: list = [None] * dist.get_world_size()
    dist.all_gather_object(got, mine)
    if dist.get_rank() == 0:
        Path(args.out).write_text(
            json.dumps(
                {
                    "p50_us": round(statistics.median(g[0] for g in got) * 1e6, 1),
                    "p99_us": round(max(g[1] for g in got) * 1e6, 1),
                    "mean_us": round(statistics.median(g[2] for g in got) * 1e6, 1),
                }
            )
        )
    guard.close()
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--mode", choices=MODES, default="paced", help=argparse.SUPPRESS)
    p.add_argument("--dir", help=argparse.SUPPRESS)
    p.add_argument("--ranks", default="2,4,8,16", help="world sizes to measure (default 2,4,8,16)")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--modes", default=",".join(MODES), help=f"which of {', '.join(MODES)} (default: all)")
    p.add_argument(
        "--agree-every-s", type=float, default=0.5, help="the paced modes' agree_every_s (default 0.5, the agent's)"
    )
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    modes = args.modes.split(",")
    if unknown := set(modes) - set(MODES):
        p.error(f"unknown mode(s): {', '.join(sorted(unknown))}")
    rows = []
    for n in (int(x) for x in args.ranks.split(",")):
        row = {"ranks": n}
        for mode in modes:
            with tempfile.TemporaryDirectory(prefix="pg-bench-step-") as tmp:
                out = Path(tmp) / "r.json"
                subprocess.run(
                    [
                        str(Path(sys.executable).parent / "torchrun"),
                        "--standalone",
                        f"--nproc-per-node={n}",
                        __file__,
                        "--worker",
                        f"--mode={mode}",
                        f"--dir={tmp}/ckpt",
                        f"--steps={args.steps}",
                        f"--agree-every-s={args.agree_every_s}",
                        f"--out={out}",
                    ],
                    check=True,
                    env={**os.environ, "OMP_NUM_THREADS": "1"},
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                row[mode] = json.loads(out.read_text())
        print(
            f"{n:>2} ranks: guard.step() p50 / mean / p99 us: "
            + "; ".join(f"{m} {row[m]['p50_us']} / {row[m]['mean_us']} / {row[m]['p99_us']}" for m in modes),
            flush=True,
        )
        rows.append(row)
    result = {"cores": os.cpu_count(), "steps": args.steps, "agree_every_s": args.agree_every_s, "runs": rows}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    if Path(args.out) == RESULTS and DEFAULT_MODE in modes:
        summarize_into_checkpoint(result)


def summarize_into_checkpoint(result: dict) -> None:
    """The agent's default mode, per world size, as ``step_boundary`` in checkpoint.json (the
    checkpoint benchmark's own file keeps this key when it is rewritten)."""
    path = RESULTS.parent / "checkpoint.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data["step_boundary"] = {
        "source": "bench/step_boundary.py",
        "mode": DEFAULT_MODE,
        "agree_every_s": result["agree_every_s"],
        "cores": result["cores"],
        "guard_step_blocks_us": {str(r["ranks"]): r[DEFAULT_MODE] for r in result["runs"]},
        "target": "p50 <= 50 us with nothing due, at 2 and at 16 ranks (flat in the number of ranks)",
    }
    path.write_text(json.dumps(data, indent=2) + "\n")
    print(f"updated {path} (step_boundary)")


if __name__ == "__main__":
    main()
