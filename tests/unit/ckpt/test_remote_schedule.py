"""When the agent queues a copy to the remote tier (one process: rank 0 copies)."""

from __future__ import annotations

import torch

from powerguard.ckpt_agent import CheckpointAgent


def test_a_jobs_own_save_reaches_the_remote_tier_even_when_the_job_ends_before_another_boundary(tmp_path):
    """The copy is queued when the save commits (on its schedule), not at the next agreed step
    boundary: a job saving at its last steps and closing had its checkpoint never copied."""
    torch.manual_seed(0)
    nas = tmp_path / "nas"
    agent = CheckpointAgent(
        job="jend",
        model=torch.nn.Linear(4, 4),
        local_dir=tmp_path / "local",
        local_every_s=0,
        remote_url=f"file://{nas}",
        remote_every_s=0.001,
    )
    agent.save(7)
    agent.close()  # the copier finishes what was queued before it stops
    assert (nas / "jend" / "step-7" / "COMMIT").exists()
