"""When the agent queues a copy to the remote tier (one process: rank 0 copies)."""

from __future__ import annotations

import pytest
import torch

from powerguard.ckpt_agent import CheckpointAgent
from powerguard.ckpt_agent.errors import NotAllHere


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


def test_the_remote_copy_is_the_checkpoint_not_what_else_its_directory_holds(tmp_path):
    """A node-local step directory also receives its peers' replicas after the COMMIT, each as a
    ``*.recv`` file until it is verified and renamed: the copy listed the directory, so it copied
    half-arrived replicas, and one renamed between the listing and its copy failed the whole
    copy (FileNotFoundError: never tried again; seen in bench/node_tier.py's smoke in CI). It
    copies what the COMMIT's manifests name, and nothing else."""
    nas, local = tmp_path / "nas", tmp_path / "local"
    agent = _saved(nas, local, "jrecv", 3)
    step = local / "jrecv" / "step-3"
    (step / "__1_0.distcp.recv").write_bytes(b"half a replica")
    expected = sorted(p.name for p in step.iterdir() if not p.name.endswith(".recv"))
    agent._remote.copy(3)
    agent.close()
    assert sorted(p.name for p in (nas / "jrecv" / "step-3").iterdir()) == expected
    restored = CheckpointAgent(
        job="jrecv", model=torch.nn.Linear(4, 4), local_dir=tmp_path / "empty", remote_url=f"file://{nas}"
    )
    assert restored.restore() == 4 and restored.progress.restored.tier == "remote"
    restored.close()


def test_a_remote_copy_without_every_file_the_checkpoint_names_is_never_committed(tmp_path):
    """A sharded job's node-local directory holds its own shards and the replicas received so far:
    the copy went ahead without the others and wrote the remote COMMIT (the acks then said
    ``remote`` for a checkpoint no restore could read). It is refused, naming what is missing."""
    nas, local = tmp_path / "nas", tmp_path / "local"
    agent = _saved(nas, local, "jmiss", 5)
    (local / "jmiss" / "step-5" / "__0_0.distcp").unlink()
    with pytest.raises(NotAllHere, match=r"step 5: 1 of the checkpoint's \d+ files are not in .*__0_0\.distcp"):
        agent._remote.copy(5)
    agent.close()
    assert not (nas / "jmiss" / "step-5" / "COMMIT").exists()


def _saved(nas, local, job: str, step: int) -> CheckpointAgent:
    """An agent with a remote tier that copies only when asked, its step ``step`` committed."""
    torch.manual_seed(0)
    agent = CheckpointAgent(
        job=job,
        model=torch.nn.Linear(4, 4),
        local_dir=local,
        local_every_s=0,
        remote_url=f"file://{nas}",
        remote_every_s=0,
    )
    agent.save(step)
    return agent
