"""A loop that draws its next batch inside the current step (as nanoGPT's get_batch does) and
does not register it: a resumed run trains on other batches. ``--fixed`` registers it;
``--frozen`` trains with a learning rate of 0 (the parameters never change)."""

import sys

import torch

from powerguard.ckpt_agent import CheckpointAgent

fixed = "--fixed" in sys.argv
steps = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 12
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.0 if "--frozen" in sys.argv else 0.1)
ahead = {"batch": torch.randn(4, 8)}  # the first batch, drawn before the restore
guard = CheckpointAgent(
    job="ahead",
    model=model,
    optimizer=opt,
    local_dir="ckpt",
    local_every_s=0,
    rank_state=ahead if fixed else None,  # the fix: the batch drawn ahead is saved and restored
)
start = guard.restore()
if not fixed and start:
    ahead["batch"] = torch.randn(4, 8)  # a restarted run draws its "first" batch again
try:
    for step in range(start, steps):
        x = ahead["batch"]
        ahead["batch"] = torch.randn(4, 8)  # the next step's batch, drawn now
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
        guard.step(step)
finally:
    guard.close()
