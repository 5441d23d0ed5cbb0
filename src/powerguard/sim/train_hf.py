"""A small deterministic Hugging Face ``Trainer`` job (a 2-layer GPT-2 built here, random token
ids, DDP with gloo on CPU) with the PowerGuard callback: what the tests, the benchmarks and
``powerguard demo --framework hf`` launch with torchrun. Nothing is downloaded.

    torchrun --standalone --nproc-per-node 2 -m powerguard.sim.train_hf --job demo \\
        --steps 200 --local-dir /tmp/ckpt --nats-url nats://127.0.0.1:4222
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time

import torch

from ._framework_job import exit_finished, guard_options, job_parser


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = job_parser(
        __doc__.split("\n\n")[0],
        steps_help="optimizer steps in all (the Trainer's max_steps)",
        local_dir_help="the Trainer's output_dir (shared by every rank)",
    )
    p.add_argument("--samples", type=int, default=256)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument(
        "--save-steps",
        type=int,
        help="the Trainer's own save schedule (0: none; default: the Trainer's own defaults, save_strategy "
        "'steps' every 500 steps and at the last step)",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

    from powerguard.ckpt_agent.hf import PowerGuardCallback, latest_checkpoint
    from powerguard.sim.train import ordered_allreduce

    args = parse(argv)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s rank{os.environ.get('RANK', 0)} %(message)s")

    class Tokens(torch.utils.data.Dataset):
        def __init__(self) -> None:
            g = torch.Generator().manual_seed(args.seed)
            self.ids = torch.randint(0, 128, (args.samples, 16), generator=g)

        def __len__(self) -> int:
            return len(self.ids)

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            return {"input_ids": self.ids[i], "labels": self.ids[i]}

    class Pace(TrainerCallback):  # the job's own pacing and progress file (what the tests watch)
        def on_train_begin(self, _args, _state, control, **_kw):
            # gradients summed in rank order (powerguard.sim.train.ordered_allreduce): with more
            # than two ranks a ring all-reduce adds in an order that depends on DDP's bucket layout,
            # which a restart rebuilds at another step; without it a resume matches only to ~1e-7
            wrapped = trainer.model_wrapped
            if isinstance(wrapped, torch.nn.parallel.DistributedDataParallel):
                wrapped.register_comm_hook(None, ordered_allreduce)
            return control

        def on_step_end(self, _args, state, control, **_kw):
            if args.progress:
                with open(args.progress, "a") as f:
                    f.write(f"{os.environ.get('RANK', 0)} {state.global_step} {time.time():.3f}\n")
            if args.step_sleep:
                time.sleep(args.step_sleep)
            return control

    training = TrainingArguments(
        output_dir=args.local_dir,
        max_steps=args.steps,
        per_device_train_batch_size=args.batch,
        learning_rate=1e-3,
        seed=args.seed,
        data_seed=args.seed,
        use_cpu=True,
        ddp_backend="gloo",
        **({} if args.save_steps is None else {"save_strategy": "steps" if args.save_steps else "no"}),
        **({"save_steps": args.save_steps} if args.save_steps else {}),
        logging_strategy="no",
        report_to=[],
        disable_tqdm=True,
        dataloader_num_workers=0,
        ddp_find_unused_parameters=False,
    )
    torch.manual_seed(args.seed)
    config = GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=128, n_positions=16, bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config)
    guard = PowerGuardCallback(**guard_options(args))
    trainer = Trainer(model=model, args=training, train_dataset=Tokens(), callbacks=[Pace(), guard])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a scheduler's stop: exit cleanly
    trainer.train(resume_from_checkpoint=latest_checkpoint(args.local_dir, job=args.job))
    if args.out and trainer.is_world_process_zero():
        torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, args.out)
    return 0


if __name__ == "__main__":
    exit_finished(main())
