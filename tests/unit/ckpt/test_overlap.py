"""Overlapped staging of periodic saves: the snapshot is the state at the checkpoint's step even
though the next forward/backward (and its BatchNorm statistics) run while parameters and
optimizer state are still being copied; the optimizer step waits for the copy."""

from __future__ import annotations

import copy

import torch
from torch import nn

from powerguard.ckpt_agent import CheckpointAgent


def _net() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.BatchNorm1d(256), nn.ReLU(), nn.Linear(256, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return model, opt


def _train(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> None:
    model(x).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()


def test_periodic_save_snapshot_is_the_state_at_its_step(tmp_path):
    model, opt = _net()
    x = torch.randn(32, 64)
    _train(model, opt, x)
    guard = CheckpointAgent(job="ov", model=model, optimizer=opt, local_dir=tmp_path, local_every_s=1e-9)
    try:
        expected = copy.deepcopy(model.state_dict())
        expected_opt = copy.deepcopy(opt.state_dict())
        guard.step(1)  # starts the periodic save: parameters are copied in the background
        assert guard.saver.unfinished and guard.saver.stager.staging is not None  # the background copy
        _train(model, opt, x * 3)  # forward changes BN stats at once; the step waits for the copy
        guard.wait()
        assert not all(torch.equal(model.state_dict()[k], expected[k]) for k in expected)  # training moved on
        assert guard.last_committed_step == 1

        fresh, fresh_opt = _net()
        _train(fresh, fresh_opt, torch.randn(32, 64))  # different values, same layout
        reader = CheckpointAgent(job="ov", model=fresh, optimizer=fresh_opt, local_dir=tmp_path, local_every_s=0)
        assert reader.restore() == 2
        for k, v in expected.items():
            assert torch.equal(fresh.state_dict()[k], v), k  # running_mean/var included
        got = fresh_opt.state_dict()["state"]
        for i, st in expected_opt["state"].items():
            assert torch.equal(got[i]["exp_avg"], st["exp_avg"]) and torch.equal(got[i]["exp_avg_sq"], st["exp_avg_sq"])
        reader.close()
    finally:
        guard.close()


def test_overlap_can_be_turned_off(tmp_path):
    model, opt = _net()
    guard = CheckpointAgent(
        job="ov2", model=model, optimizer=opt, local_dir=tmp_path, local_every_s=1e-9, overlap_staging=False
    )
    try:
        guard.step(1)
        assert guard.saver.stager.staging is None  # staged synchronously inside step()
        guard.wait()
        assert guard.last_committed_step == 1
    finally:
        guard.close()
