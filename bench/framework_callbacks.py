"""What PowerGuard's framework callbacks cost a training step when nothing is due: PyTorch
Lightning's ``PowerGuardCallback.on_train_batch_end`` and the Hugging Face Trainer's
``PowerGuardCallback.on_step_end``, in 2-rank DDP jobs (torchrun, gloo, CPU; the sims' small
models), with the agent's defaults (pipelined agreement paced about every 0.5 s). Per rank, the
time inside the callback's hook over --steps steps (the median over ranks of each rank's p50 and
mean, the worst p99), and the whole step's median with the callback and without it (the same job,
runs alternated, medians of --repeats: on 2 cores that difference is within the step's noise).
And a stop that stops: per integration (plain PyTorch, Lightning, HF Trainer), a 2-rank job paused
after a final checkpoint (``then: pause``) gets SIGTERM at its launcher; the seconds until every
rank is gone (``sigterm_to_exit_s``; the same path as ``tests/integration/ckpt/test_framework_stop.py``).
Writes bench/results/framework_callbacks.json.
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

sys.path.insert(0, str(Path(__file__).parent))  # its helpers, as when it runs as a script
from _torchrun import parser, workers

RESULTS = Path(__file__).parent / "results" / "framework_callbacks.json"
ROOT = str(Path(__file__).resolve().parents[1])  # the repository: the tests' helpers
FRAMEWORKS = ("lightning", "hf")


def _summary(hook: list[float], steps: list[float]) -> tuple:
    hook, steps = sorted(hook[10:]), sorted(steps[10:])  # the first steps connect the groups
    return (
        hook[len(hook) // 2] if hook else 0.0,
        hook[int(len(hook) * 0.99)] if hook else 0.0,
        statistics.fmean(hook) if hook else 0.0,
        steps[len(steps) // 2],
    )


def lightning_worker(args: argparse.Namespace, hook: list[float], steps: list[float]) -> None:
    import pytorch_lightning as pl
    import torch
    from pytorch_lightning.strategies import DDPStrategy
    from torch import nn
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    from powerguard.ckpt_agent.lightning import ResumableLoader, callback_class

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))

        def training_step(self, batch, _idx):
            x, y = batch
            return nn.functional.mse_loss(self.net(x).squeeze(1), y)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    base = callback_class("pytorch_lightning")

    class Timed(base):
        def on_train_batch_end(self, *a, **kw):
            t0 = time.perf_counter()
            super().on_train_batch_end(*a, **kw)
            hook.append(time.perf_counter() - t0)

    class Clock(pl.Callback):
        last = None

        def on_train_batch_end(self, *_a, **_kw):
            now = time.perf_counter()
            if self.last is not None:
                steps.append(now - self.last)
            self.last = now

    pl.seed_everything(0, verbose=False)
    data = TensorDataset(torch.randn(4096, 32), torch.randn(4096))
    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    loader = ResumableLoader(DataLoader(data, batch_size=8, sampler=DistributedSampler(data, world, rank)))
    callbacks = [Clock()] + ([Timed(job="bench", dirpath=args.dir)] if args.with_callback else [])
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=world,
        strategy=DDPStrategy(process_group_backend="gloo"),
        max_steps=args.steps,
        use_distributed_sampler=False,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Module(), loader)


def hf_worker(args: argparse.Namespace, hook: list[float], steps: list[float]) -> None:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

    from powerguard.ckpt_agent.hf import PowerGuardCallback

    class Timed(PowerGuardCallback):
        def on_step_end(self, *a, **kw):
            t0 = time.perf_counter()
            out = super().on_step_end(*a, **kw)
            hook.append(time.perf_counter() - t0)
            return out

    class Clock(TrainerCallback):
        last = None

        def on_step_end(self, _args, _state, control, **_kw):
            now = time.perf_counter()
            if self.last is not None:
                steps.append(now - self.last)
            self.last = now
            return control

    class Tokens(torch.utils.data.Dataset):
        ids = torch.randint(0, 128, (4096, 16), generator=torch.Generator().manual_seed(0))

        def __len__(self) -> int:
            return len(self.ids)

        def __getitem__(self, i):
            return {"input_ids": self.ids[i], "labels": self.ids[i]}

    training = TrainingArguments(
        output_dir=args.dir,
        max_steps=args.steps,
        per_device_train_batch_size=4,
        use_cpu=True,
        ddp_backend="gloo",
        save_strategy="no",
        logging_strategy="no",
        report_to=[],
        disable_tqdm=True,
        ddp_find_unused_parameters=False,
    )
    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=128, n_positions=16, bos_token_id=0, eos_token_id=0)
    )
    callbacks = [Clock()] + ([Timed(job="bench")] if args.with_callback else [])
    Trainer(model=model, args=training, train_dataset=Tokens(), callbacks=callbacks).train()


def worker(args: argparse.Namespace) -> None:
    hook: list[float] = []
    steps: list[float] = []
    (lightning_worker if args.framework == "lightning" else hf_worker)(args, hook, steps)
    import torch.distributed as dist

    mine = _summary(hook, steps)
    got: list = [None] * dist.get_world_size()
    dist.all_gather_object(got, mine)
    if dist.get_rank() == 0:
        Path(args.out).write_text(
            json.dumps(
                {
                    "hook_p50_us": round(statistics.median(g[0] for g in got) * 1e6, 1),
                    "hook_p99_us": round(max(g[1] for g in got) * 1e6, 1),
                    "hook_mean_us": round(statistics.median(g[2] for g in got) * 1e6, 1),
                    "step_p50_ms": round(statistics.median(g[3] for g in got) * 1e3, 3),
                }
            )
        )
    # the process group ended before the interpreter: its gloo threads alive at exit abort the rank
    # ("terminate called without an active exception", SIGABRT: seen in one CI run of the HF smoke)
    dist.destroy_process_group()


def run_one(framework: str, steps: int, with_callback: bool) -> dict:
    args = [f"--framework={framework}", f"--steps={steps}", *(["--with-callback"] if with_callback else [])]
    return workers(__file__, 2, *args)


async def sigterm_to_exit(integrations: list[str]) -> dict[str, float]:
    """Seconds from SIGTERM to every rank gone, for a job paused after its final checkpoint."""
    import tempfile

    sys.path.insert(0, ROOT)
    from powerguard.bus import Bus, BusNames, EmbeddedNats
    from tests.integration.ckpt.test_framework_stop import paused_then_stopped

    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="pg-bench-stop-") as tmp:
        server = EmbeddedNats(store_dir=Path(tmp) / "nats")
        server.start()
        try:
            bus = await Bus.connect(server.url, service="bench", names=BusNames.isolated())
            try:
                for integration in integrations:
                    work = Path(tmp) / integration
                    work.mkdir()
                    out[integration] = round(await paused_then_stopped(bus, server, work, integration), 2)
            finally:
                await bus.close()
        finally:
            server.stop()
    return out


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--framework", choices=FRAMEWORKS, help=argparse.SUPPRESS)
    p.add_argument("--with-callback", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--steps", type=int, default=400, help="training steps per run (default 400)")
    p.add_argument("--frameworks", default=",".join(FRAMEWORKS), help="which of lightning,hf (default both)")
    p.add_argument("--repeats", type=int, default=3, help="runs with and without the callback, alternated (medians)")
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    rows = []
    for framework in args.frameworks.split(","):
        if framework not in FRAMEWORKS:
            p.error(f"unknown framework {framework!r}")
        runs_with, runs_without = [], []
        for _ in range(args.repeats):  # alternated: the machine's drift hits both alike
            runs_with.append(run_one(framework, args.steps, True))
            runs_without.append(run_one(framework, args.steps, False))
        row = {
            "framework": framework,
            **{k: statistics.median(r[k] for r in runs_with) for k in runs_with[0]},
            "step_p50_ms_without_callback": statistics.median(r["step_p50_ms"] for r in runs_without),
            "repeats": args.repeats,
        }
        print(
            f"{framework}: callback hook p50 / mean / p99 {row['hook_p50_us']} / {row['hook_mean_us']} / "
            f"{row['hook_p99_us']} us; step p50 {row['step_p50_ms']} ms with, "
            f"{row['step_p50_ms_without_callback']} ms without",
            flush=True,
        )
        rows.append(row)
    stops = asyncio.run(sigterm_to_exit(["torch", *args.frameworks.split(",")]))
    print(f"SIGTERM to exit while paused: {stops}", flush=True)
    result = {"cores": os.cpu_count(), "ranks": 2, "steps": args.steps, "runs": rows, "sigterm_to_exit_s": stops}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
