"""``powerguard try``'s pieces on their own: the agent's try mode from the environment (the
site's job name, nodes and checkpoint root replace the script's; a progress line per step; the
pace), and the drill's arithmetic over a reference run's progress lines."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from powerguard.ckpt_agent import CheckpointAgent
from powerguard.ckpt_agent import _check as C
from powerguard.sim import tryout as T
from powerguard.sim.errors import DrillError


def test_the_environment_names_the_mode_and_a_bad_value_is_refused():
    mode = C.CheckMode.from_env(
        {C.DIR: "/d", C.FINAL: "1", C.TRY_JOB: "j", C.TRY_NODES: "n1,n2", C.TRY_MIN_STEP_S: "0.2"}
    )
    assert (mode.on, mode.final, mode.job, mode.nodes, mode.min_step_s) == (True, True, "j", ("n1", "n2"), 0.2)
    # ranks split over the nodes in order, as torchrun numbers them
    assert [mode.node({"RANK": str(r), "WORLD_SIZE": "4"}) for r in range(4)] == ["n1", "n1", "n2", "n2"]
    assert mode.root("/d", node="n2", node_scope=True) == "/d/n2"  # every simulated node its own disk
    assert mode.root("/d", node="n2", node_scope=False) == "/d"
    assert C.CheckMode.from_env({}).node() is None
    with pytest.raises(ValueError, match=C.TRY_MIN_STEP_S):
        C.CheckMode.from_env({C.TRY_MIN_STEP_S: "fast"})


def test_under_try_the_sites_name_and_directory_replace_the_scripts(tmp_path, monkeypatch):
    progress = tmp_path / "progress.txt"
    for k, v in {
        C.DIR: str(tmp_path / "drill"),
        C.FINAL: "1",
        C.TRY_JOB: "site-name",
        C.TRY_PROGRESS: str(progress),
        C.TRY_MIN_STEP_S: "0.05",
    }.items():
        monkeypatch.setenv(k, v)
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    started = time.monotonic()
    with CheckpointAgent(job="scripts-name", model=model, optimizer=opt, local_dir=tmp_path / "mine") as guard:
        assert guard.job == "site-name"
        for step in range(guard.restore(), 5):
            opt.zero_grad()
            model(torch.ones(1, 4)).sum().backward()
            opt.step()
            guard.step(step)
    assert time.monotonic() - started >= 4 * 0.05  # paced: 5 boundaries at least 0.05 s apart
    assert [ln.split()[:2] for ln in progress.read_text().splitlines()] == [["0", str(s)] for s in range(5)]
    # the last step checkpointed at close, in the drill's directory under the site's name
    assert os.path.exists(tmp_path / "drill" / "site-name" / "step-4" / "COMMIT")
    assert not (tmp_path / "mine").exists()


def _lines(steps: int, step_s: float, world: int = 2) -> list[tuple[int, int, float]]:
    return [(r, s, 100 + s * step_s) for s in range(steps) for r in range(world)]


def test_the_reference_gives_the_jobs_shape_and_a_short_job_is_refused_naming_the_fix(tmp_path):
    ref = T.reference_of(_lines(300, 0.1, world=4), seconds=40.0, log=tmp_path / "ref.log")
    assert (ref.world, ref.first_step, ref.steps, ref.step_s) == (4, 0, 300, pytest.approx(0.1))
    assert T.drill_fits(ref, warmup_steps=30, hold_s=3, min_step_s=0.05) is None  # 30 + 130 steps needed
    short = T.reference_of(_lines(100, 0.1), seconds=15.0, log=tmp_path / "ref.log")
    why = T.drill_fits(short, warmup_steps=10, hold_s=3, min_step_s=0.05)
    assert why is not None and "trains 100 steps" in why and "--min-step-s" in why
    # a job whose steps are paced slower fits in fewer steps
    assert T.drill_fits(short, warmup_steps=10, hold_s=3, min_step_s=0.2) is None
    with pytest.raises(DrillError, match=r"guard\.step"):
        T.reference_of([], seconds=1.0, log=tmp_path / "ref.log")


def test_a_cut_line_is_skipped(tmp_path):
    p = tmp_path / "progress.txt"
    p.write_text("0 1 10.0\n1 1 10.1\n0 2")  # the last line cut by a kill
    assert T.progress_lines(p) == [(0, 1, 10.0), (1, 1, 10.1)]


def test_node_scope_checkpoints_are_gathered_into_one_directory(tmp_path):
    root = tmp_path / "drill"
    for node, files in {"n1": ["__0_0.distcp", ".metadata"], "n2": ["__1_0.distcp", "__0_0.distcp"]}.items():
        for step in (3, 7):
            d = root / node / "job" / f"step-{step}"
            d.mkdir(parents=True)
            for f in [*files, "COMMIT"]:
                (d / f).write_text(f"{node}:{f}")
    (root / "n2" / "job" / "step-9").mkdir()  # not committed: not the newest
    step, merged = T.newest_committed(root, job="job", nodes=["n1", "n2"])
    assert step == 7
    names = {p.name: p.read_text() for p in Path(merged).iterdir()}
    assert set(names) == {"__0_0.distcp", "__1_0.distcp", ".metadata", "COMMIT"}
    assert names["__0_0.distcp"] == "n1:__0_0.distcp"  # one copy of each file
    with pytest.raises(DrillError, match="no committed checkpoint"):
        T.newest_committed(tmp_path / "none", job="job")


def test_check_resume_stop_at_on_a_framework_job_points_to_try(tmp_path, monkeypatch):
    monkeypatch.setenv(C.DIR, str(tmp_path / "check"))
    monkeypatch.setenv(C.STOP_AT, "5")
    with pytest.raises(ValueError, match="powerguard try"):
        CheckpointAgent(job="j", model=nn.Linear(2, 2), local_dir=tmp_path, framework="lightning")
