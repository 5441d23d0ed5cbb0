"""Checkpoints on the power-cut filesystem: a checkpoint whose save returned (what an ack
reports) survives a power cut right after it, bit-exact; one cut short is never loaded."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from powerguard.ckpt_agent import CheckpointAgent


def _agent(directory, seed: int = 0) -> tuple[CheckpointAgent, nn.Module]:
    torch.manual_seed(seed)
    model = nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return CheckpointAgent(job="pc", model=model, optimizer=opt, local_dir=directory, local_every_s=0), model


def test_a_saved_checkpoint_survives_a_cut_right_after_the_save_returned(powercut):
    d = powercut.mountpoint / "ckpt"
    writer, model = _agent(d)
    writer.save(3)
    with torch.no_grad():
        model.weight.add_(1.0)
    writer.save(5)
    want = {k: v.clone() for k, v in model.state_dict().items()}
    powercut.cut()  # the power goes the moment save() returned
    writer.close()
    powercut.start()
    reader, restored = _agent(d, seed=1)
    try:
        assert reader.restore() == 6  # the step after the newest durable one
        assert all(torch.equal(restored.state_dict()[k], v) for k, v in want.items())
    finally:
        reader.close()


def test_cuts_at_random_instants_of_a_saving_job_lose_no_acked_checkpoint(tmp_path):
    """Fixed seeds of the campaign (bench/powercut.py runs hundreds)."""
    from . import unavailable
    from .campaign import checkpoint_cut

    _require(unavailable())
    results = [checkpoint_cut(tmp_path, seed) for seed in (1, 2, 3)]
    assert all(r.acked for r in results), results
    assert [v for r in results for v in r.violations] == [], results


def test_a_remote_copy_reported_committed_survives_a_cut_of_the_host_that_holds_it(tmp_path):
    """The remote tier on a file system of a host that loses power too (a NAS on the same UPS):
    after the cut the node is gone, the restore reads the remote tier alone, and finds at least
    the newest copy the agent reported committed there (an ack raised to ``remote``). Before
    the copier fsynced its files and directories, every cut lost every remote copy (8 of 8
    seeds: the step directories' names were never made durable)."""
    from . import unavailable
    from .campaign import checkpoint_cut

    _require(unavailable())
    results = [checkpoint_cut(tmp_path, seed, remote=True) for seed in (1, 2)]
    assert all(r.remote for r in results), results  # copies were made and reported before the cut
    assert [v for r in results for v in r.violations] == [], results


def _require(why: str | None) -> None:
    from tests.conftest import IN_CI

    if why and IN_CI:
        pytest.fail(f"power-cut filesystem: {why} (CI must provide it)")
    if why:
        pytest.skip(why)
