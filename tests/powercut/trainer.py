"""A one-rank job for power-cut campaigns: trains deterministically (the weights after step N
are a function of N), saves every ``--every`` steps with the ckpt-agent and prints ``acked N``
once a save returned (what an ack reports). ``--restore`` prints ``restored N ok|wrong``.
With ``--remote URL`` rank 0's remote copier copies every committed checkpoint there and the
job prints ``remote N`` once a copy is committed remotely (what raises an ack to ``remote``).

    python -m tests.powercut.trainer DIR [--every 1] [--remote file:///nas] [--restore]
"""

from __future__ import annotations

import argparse
import sys
import threading

import torch
from torch import nn

from powerguard.ckpt_agent import CheckpointAgent


def expected(step: int) -> dict[str, torch.Tensor]:
    """The weights after ``step`` steps."""
    torch.manual_seed(0)
    model = nn.Linear(64, 64)
    with torch.no_grad():
        for _ in range(step):  # as the job does it: float sums depend on the order
            for p in model.parameters():
                p.add_(1.0)
    return {k: v.clone() for k, v in model.state_dict().items()}


_OUT = threading.Lock()


def say(line: str) -> None:
    """One whole line: the remote copier's thread reports too (print writes the newline apart)."""
    with _OUT:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("directory")
    p.add_argument("--every", type=int, default=1)
    p.add_argument("--restore", action="store_true")
    p.add_argument("--keep", type=int, default=2)
    p.add_argument("--remote", help="the remote tier's URL (file:///...)")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    model = nn.Linear(64, 64)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    agent = CheckpointAgent(
        job="pc",
        model=model,
        optimizer=opt,
        local_dir=args.directory,
        local_every_s=0,
        keep=args.keep,
        remote_url=args.remote,
        remote_every_s=0.01 if args.remote else 1800.0,
        writer_threads=3,  # several files, each written and fsynced by its own thread (a large power checkpoint's way)
    )
    copier = getattr(agent, "_remote", None)  # the test peer reports what the agent would ack "remote"
    if copier is not None and not args.restore:
        acked_remote = copier.on_copied

        def copied(step: int, url: str) -> None:
            say(f"remote {step}")
            if acked_remote is not None:
                acked_remote(step, url)

        copier.on_copied = copied
    try:
        start = agent.restore()  # the next step to run
        done = max(0, start - 1) if start else 0
        if args.restore:
            want = expected(done)
            ok = all(torch.equal(model.state_dict()[k], v) for k, v in want.items())
            print(f"restored {done} {'ok' if ok else 'wrong'}", flush=True)
            return 0
        step = done
        while True:
            step += 1
            with torch.no_grad():
                for p_ in model.parameters():
                    p_.add_(1.0)
            if step % args.every == 0:
                agent.save(step)
                say(f"acked {step}")
            agent.step(step)  # the step boundary: where the remote copier is handed committed steps
    finally:
        agent.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
