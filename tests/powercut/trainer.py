"""A one-rank job for power-cut campaigns: trains deterministically (the weights after step N
are a function of N), saves every ``--every`` steps with the ckpt-agent and prints ``acked N``
once a save returned (what an ack reports). ``--restore`` prints ``restored N ok|wrong``.

    python -m tests.powercut.trainer DIR [--every 1] [--restore]
"""

from __future__ import annotations

import argparse
import sys

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


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("directory")
    p.add_argument("--every", type=int, default=1)
    p.add_argument("--restore", action="store_true")
    p.add_argument("--keep", type=int, default=2)
    args = p.parse_args(argv)
    torch.manual_seed(0)
    model = nn.Linear(64, 64)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    agent = CheckpointAgent(
        job="pc", model=model, optimizer=opt, local_dir=args.directory, local_every_s=0, keep=args.keep
    )
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
                print(f"acked {step}", flush=True)
    finally:
        agent.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
