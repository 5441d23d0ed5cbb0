"""A small, deterministic DDP (FSDP2, tensor-parallel) training job with the ckpt-agent: the simulated site's workload,
and what the tests and benchmarks launch with ``torchrun``.

    torchrun --standalone --nproc-per-node 2 -m powerguard.sim.train --job demo --steps 200 \\
        --local-dir /tmp/ckpt --nats-url nats://127.0.0.1:4222
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import itertools
import logging
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from powerguard.bus import BusNames
from powerguard.ckpt_agent import CheckpointAgent

from ._framework_job import exit_finished, job_parser, rank_node
from ._parallel import SHARDS, parallelize


def build(seed: int, width: int, samples: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, 32, generator=g)
    y = (x @ torch.randn(32, 1, generator=g)).squeeze(1) + 0.1 * torch.randn(samples, generator=g)
    torch.manual_seed(seed)  # same initial weights on every rank
    model = nn.Sequential(nn.Linear(32, width), nn.ReLU(), nn.Dropout(0.1), nn.Linear(width, 1))
    return TensorDataset(x, y), model


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = job_parser(
        __doc__.split("\n\n")[0],
        steps_help="training steps (default 100)",
        local_dir_help="local tier root; {node} becomes the rank's node name",
    )
    p.add_argument("--remote-url")
    p.add_argument(
        "--local-scope",
        choices=["shared", "node"],
        default="shared",
        help="local tier: one shared directory, or each node's own disk (with peer replicas)",
    )
    p.add_argument("--replicas", type=int, default=1, help="node scope: peer nodes holding a copy of each node's files")
    p.add_argument("--reshard", action="store_true", help="resume a checkpoint of more ranks (not bit-exact)")
    p.add_argument(
        "--shard",
        choices=SHARDS,
        default="ddp",
        help="ddp: replicated model; fsdp: FSDP2 (sharded); tp: tensor parallel (DTensor); hsdp: FSDP2 on a "
        "2-D mesh (replicas of shards); fsdp-tp: FSDP2 across pairs of ranks, tensor parallel within each pair",
    )
    p.add_argument(
        "--allow-fresh-start", action="store_true", help="train from step 0 when no checkpoint can be restored"
    )
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--samples", type=int, default=512)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--local-every-s", type=float, default=0.0)
    p.add_argument("--remote-every-s", type=float, default=0.0)
    p.add_argument("--hang-rank", type=int, default=-1, help="this rank stops at --hang-step (a hung rank)")
    p.add_argument("--hang-step", type=int, default=-1)
    p.add_argument("--save-at", type=int, default=-1, help="a synchronous checkpoint at this step")
    p.add_argument("--pg-timeout-s", type=float, help="timeout of the training's own process group (default torch's)")
    p.add_argument("--http-port", type=int, help="serve POST /api/v1/trigger_checkpoint on rank 0")
    p.add_argument(
        "--grad-scaler",
        action="store_true",
        help="scale the loss with a GradScaler (its scale grows every 10 steps: state a resume must restore)",
    )
    p.add_argument("--eval-every", type=int, default=0, help="an evaluation after every N steps (0: none)")
    p.add_argument(
        "--eval-at", type=int, action="append", default=[], help="an evaluation after this step (repeatable)"
    )
    p.add_argument("--eval-s", type=float, default=0.0, help="... lasting this long (forward passes and all-reduces)")
    p.add_argument(
        "--eval-outside-quiescent",
        action="store_true",
        help="evaluate without guard.quiescent() (a request then waits for the next step boundary)",
    )
    p.add_argument("--eval-log", help="append '<rank> <step> start|end <time>' per evaluation to this file")
    return p.parse_args(argv)


def evaluate(model, data, seconds: float) -> float:
    """Forward passes over the data and an all-reduce of the loss for ``seconds`` (the ranks in
    step, as DDP evaluation is): reads the model, changes nothing, draws no random number."""
    model.eval()
    total = torch.zeros(1)
    deadline = time.monotonic() + seconds
    with torch.no_grad():
        while True:
            x, y = data.tensors
            total += nn.functional.mse_loss(model(x).squeeze(1), y)
            dist.all_reduce(total)
            done = torch.tensor([1 if time.monotonic() >= deadline else 0])
            dist.all_reduce(done, op=dist.ReduceOp.MIN)  # every rank stops at the same pass
            if done.item():
                break
            time.sleep(0.05)
    model.train()
    return total.item()


def log_eval(path: str | None, rank: int, step: int, what: str) -> None:
    if path:
        with open(path, "a") as f:
            f.write(f"{rank} {step} {what} {time.time():.3f}\n")


def ordered_allreduce(_state, bucket):
    """DDP comm hook: gather every rank's gradients and add them in rank order (bit-reproducible)."""
    grad = bucket.buffer()
    parts = [torch.empty_like(grad) for _ in range(dist.get_world_size())]
    fut = dist.all_gather(parts, grad, async_op=True).get_future()

    def total(_fut):
        out = parts[0].clone()
        for part in parts[1:]:
            out += part
        return out.div_(len(parts))

    return fut.then(total)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s rank{os.environ.get('RANK', 0)} %(message)s")
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # a stuck rank's stacks, to its log (bench/chaos.py)
    if args.pg_timeout_s:
        from datetime import timedelta

        dist.init_process_group("gloo", timeout=timedelta(seconds=args.pg_timeout_s))
    else:
        dist.init_process_group("gloo")
    rank = dist.get_rank()
    data, model = build(args.seed, args.width, args.samples)
    ddp, same = parallelize(model, args.shard, ddp_hook=ordered_allreduce)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=25, gamma=0.5)
    sampler = DistributedSampler(data, shuffle=True, seed=args.seed, **same)
    # its own generator: creating an iterator must not draw from the global RNG (dropout uses that)
    loader = DataLoader(
        data, batch_size=args.batch, sampler=sampler, generator=torch.Generator().manual_seed(args.seed)
    )
    names = BusNames(prefix=args.prefix, stream=args.stream, agents=args.agents_bucket)
    node = rank_node(args)
    scaler = torch.amp.GradScaler("cpu", growth_interval=10) if args.grad_scaler else None
    guard = CheckpointAgent(
        job=args.job,
        model=ddp,
        optimizer=opt,
        scheduler=sched,
        extra_state={"scaler": scaler} if scaler is not None else None,
        local_dir=args.local_dir.format(node=node or "node"),  # a simulated node's own disk: ".../{node}"
        remote_url=args.remote_url,
        local_scope=args.local_scope,
        replicas=args.replicas,
        reshard=args.reshard,
        allow_fresh_start=args.allow_fresh_start,
        nats_url=args.nats_url,
        names=names,
        node=node,
        local_every_s=args.local_every_s,
        remote_every_s=args.remote_every_s,
        http_port=args.http_port,
        hold_policy=args.hold_policy,
        **({"agree_every_s": args.agree_every_s} if args.agree_every_s is not None else {}),
    )
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # scheduler stop: exit cleanly (close() runs)
    try:
        start = guard.restore()
        per_epoch = len(loader)
        step = start
        while step < args.steps:
            epoch, offset = divmod(step, per_epoch)
            sampler.set_epoch(epoch)
            for x, y in itertools.islice(loader, offset, None):
                if step >= args.steps:
                    break
                if rank == args.hang_rank and step == args.hang_step:
                    time.sleep(3600)
                opt.zero_grad()
                loss = nn.functional.mse_loss(ddp(x).squeeze(1), y)
                if scaler is not None:
                    scaler.scale(loss).backward()
                    scaler.step(opt)
                    scaler.update()
                else:
                    loss.backward()
                    opt.step()
                sched.step()
                if args.progress:
                    with open(args.progress, "a") as f:
                        f.write(f"{rank} {step} {time.time():.3f}\n")
                guard.step(step)
                if step == args.save_at:
                    guard.save(step)
                periodic = args.eval_every and step % args.eval_every == args.eval_every - 1
                if (periodic or step in args.eval_at) and step + 1 < args.steps:
                    log_eval(args.eval_log, rank, step, "start")
                    with contextlib.nullcontext() if args.eval_outside_quiescent else guard.quiescent():
                        evaluate(ddp, data, args.eval_s)
                    log_eval(args.eval_log, rank, step, "end")
                if args.step_sleep:
                    time.sleep(args.step_sleep)
                step += 1
        if args.out and args.shard != "ddp":  # the whole model on rank 0: every rank gathers its shards
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
            if rank == 0:
                torch.save({k: v.detach().clone() for k, v in full.items()}, args.out)
        elif args.out and rank == 0:
            torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, args.out)
    finally:
        guard.close()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    exit_finished(main())
