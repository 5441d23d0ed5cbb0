"""A small deterministic PyTorch Lightning job (DDP, gloo on CPU) with the PowerGuard callback:
what the tests, the benchmarks and ``powerguard demo --framework lightning`` launch with torchrun.

    torchrun --standalone --nproc-per-node 2 -m powerguard.sim.train_lightning --job demo \\
        --steps 200 --local-dir /tmp/ckpt --nats-url nats://127.0.0.1:4222
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
import warnings

import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from powerguard.ckpt_agent.lightning import ResumableLoader, callback_class, latest_checkpoint

from ._framework_job import exit_finished, guard_options, job_parser


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = job_parser(
        __doc__.split("\n\n")[0],
        steps_help="optimizer steps in all (Lightning's max_steps)",
        local_dir_help="the shared checkpoint directory",
    )
    p.add_argument("--samples", type=int, default=512)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument(
        "--docs-loader",
        action="store_true",
        help="the loader as docs/frameworks/lightning.md builds it: a plain shuffled DataLoader without a "
        "generator, wrapped in ResumableLoader, Lightning's use_distributed_sampler left on",
    )
    p.add_argument(
        "--lightnings-sigterm",
        action="store_true",
        help="no SIGTERM handler of the script's own: Lightning's alone (it only sets a flag its loop reads "
        "between batches), as in Lightning's own examples",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    import pytorch_lightning as pl
    from pytorch_lightning.strategies import DDPStrategy

    from powerguard.sim.train import ordered_allreduce

    args = parse(argv)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s rank{os.environ.get('RANK', 0)} %(message)s")
    warnings.filterwarnings("ignore", module="pytorch_lightning")  # its deprecation chatter, not ours

    class Regression(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 1))

        def training_step(self, batch, _idx):
            x, y = batch
            return nn.functional.mse_loss(self.net(x).squeeze(1), y)

        def configure_optimizers(self):
            opt = torch.optim.AdamW(self.parameters(), lr=1e-2)
            return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=25, gamma=0.5)}

    class Pace(pl.Callback):  # the job's own pacing and progress file (what the tests watch)
        def on_train_start(self, trainer, _module):
            # gradients summed in rank order (powerguard.sim.train.ordered_allreduce): with more
            # than two ranks a ring all-reduce adds in an order that depends on DDP's bucket layout,
            # which a restart rebuilds at another step; without it a resume matches only to ~1e-7.
            # (Lightning's own ddp_comm_hook option registers hooks on CUDA only.)
            if isinstance(trainer.strategy.model, torch.nn.parallel.DistributedDataParallel):
                trainer.strategy.model.register_comm_hook(None, ordered_allreduce)

        def on_train_batch_end(self, trainer, _module, _out, _batch, _idx):
            if args.progress:
                with open(args.progress, "a") as f:
                    f.write(f"{trainer.global_rank} {trainer.global_step} {time.time():.3f}\n")
            if trainer.global_step == 1:
                print(f"rank {trainer.global_rank}: {trainer.num_training_batches} batches per epoch", flush=True)
            if args.step_sleep:
                time.sleep(args.step_sleep)

    pl.seed_everything(args.seed, verbose=False)
    g = torch.Generator().manual_seed(args.seed)
    x = torch.randn(args.samples, 32, generator=g)
    y = (x @ torch.randn(32, 1, generator=g)).squeeze(1) + 0.1 * torch.randn(args.samples, generator=g)
    data = TensorDataset(x, y)
    world, rank = int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("RANK", 0))
    if args.docs_loader:  # the docs' way: Lightning's distributed sampler, no generator of its own
        loader = ResumableLoader(DataLoader(data, batch_size=args.batch, shuffle=True))
    else:
        sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
        loader = ResumableLoader(
            DataLoader(data, batch_size=args.batch, sampler=sampler, generator=torch.Generator().manual_seed(args.seed))
        )
    model = Regression()
    guard = callback_class("pytorch_lightning")(dirpath=args.local_dir, **guard_options(args))
    strategy = DDPStrategy(process_group_backend="gloo") if world > 1 else "auto"
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=world,
        strategy=strategy,
        max_steps=args.steps,
        use_distributed_sampler=args.docs_loader,  # else the loader above is already per rank
        callbacks=[Pace(), guard],  # the progress line of a step before a pause in it
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    if not args.lightnings_sigterm:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a scheduler's stop: exit cleanly
    trainer.fit(model, loader, ckpt_path=latest_checkpoint(args.local_dir, job=args.job), weights_only=True)
    if args.out and trainer.global_rank == 0:
        torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, args.out)
    return 0


if __name__ == "__main__":
    exit_finished(main())
