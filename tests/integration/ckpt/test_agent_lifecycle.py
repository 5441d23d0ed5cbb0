"""A job that closes its agent, destroys its process groups and lets the agent go (as every
training script's exit does) must exit: 4 ranks (torchrun, gloo, DDP), both step agreements.
Before close() destroyed the agent's own groups, a gloo group's destructor run after the job's
``destroy_process_group()`` hung one rank in most runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

TORCHRUN = Path(sys.executable).parent / "torchrun"
WORKER = """
import gc, os, sys
import torch, torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from powerguard.ckpt_agent import CheckpointAgent

dist.init_process_group("gloo")
model = DDP(nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1)))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
agent = CheckpointAgent(job="life", model=model, optimizer=opt, local_dir=sys.argv[1], local_every_s=0,
                        pipelined_agreement=sys.argv[2] == "pipelined")
x, y = torch.randn(8, 64), torch.randn(8, 1)
for step in range(100):
    opt.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    agent.step(step)
losses = [None] * dist.get_world_size()
dist.all_gather_object(losses, float(step))  # the job's own end-of-run collective
agent.close()
dist.destroy_process_group()
del model, opt, agent
gc.collect()
print(f"rank {os.environ['RANK']} exited cleanly", flush=True)
"""


@pytest.mark.parametrize("agreement", ["pipelined", "blocking"])
def test_a_closed_agent_lets_the_ranks_exit_after_the_job_destroys_its_groups(tmp_path, agreement):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    try:
        out = subprocess.run(
            [str(TORCHRUN), "--standalone", "--nproc-per-node=4", str(script), str(tmp_path / "ckpt"), agreement],
            capture_output=True,
            text=True,
            timeout=90,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"a rank hung at exit: {exc.stdout!r}")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert sorted(re.findall(r"rank (\d) exited cleanly", out.stdout)) == ["0", "1", "2", "3"]  # lines interleave
