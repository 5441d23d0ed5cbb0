"""What a job registers is saved as it is at the save and restored into the job's own objects;
a restart never silently starts from step 0; every start says in one line where it resumed."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

from powerguard.ckpt_agent import CheckpointAgent, NoRestorableCheckpoint
from powerguard.ckpt_agent import _layout as L


class Scaler:
    """A stateful object of the job's own (a GradScaler, a prefetching iterator): state_dict/load_state_dict."""

    def __init__(self) -> None:
        self.scale = 1.0

    def state_dict(self) -> dict:
        return {"scale": torch.tensor(self.scale)}

    def load_state_dict(self, sd: dict) -> None:
        self.scale = float(sd["scale"])


def _agent(tmp_path, extra, **kw) -> CheckpointAgent:
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    return CheckpointAgent(job="reg", model=model, local_dir=tmp_path, local_every_s=0, extra_state=extra, **kw)


def test_extra_state_is_live_and_restored_into_the_jobs_own_objects(tmp_path):
    scaler = Scaler()
    extra = {"tokens_seen": 0, "scaler": scaler}
    with _agent(tmp_path, extra) as guard:
        extra["tokens_seen"] = 4096  # set after the agent was made: saved all the same
        scaler.scale = 512.0
        guard.save(3)
    fresh_scaler = Scaler()
    mine = {"tokens_seen": 0, "scaler": fresh_scaler}
    with _agent(tmp_path, mine) as guard:
        assert guard.restore() == 4
    assert mine["tokens_seen"] == 4096  # written back into the dict the job holds
    assert mine["scaler"] is fresh_scaler and fresh_scaler.scale == 512.0  # restored in place


def test_checkpoints_that_cannot_be_restored_raise_naming_the_newest_and_why(tmp_path):
    with _agent(tmp_path, None) as guard:
        guard.save(2)
        guard.save(5)
    for step in (2, 5):  # as if written by 2 ranks (COMMIT is not keyed here: edit it)
        commit = f"{L.step_dir(str(tmp_path), 'reg', step)}/{L.COMMIT}"
        body = json.loads(open(commit).read())
        open(commit, "w").write(json.dumps({**body, "world_size": 2}))
    with _agent(tmp_path, None) as guard, pytest.raises(NoRestorableCheckpoint) as err:
        guard.restore()
    text = str(err.value)
    assert "job reg has 2 committed checkpoint(s) and none can be restored" in text
    assert "step-5" in text and "written by 2 ranks, this job has 1" in text and "allow_fresh_start=True" in text
    with _agent(tmp_path, None, allow_fresh_start=True) as guard:
        assert guard.restore() == 0  # asked for: trains from step 0 over them


def test_an_uncommitted_leftover_is_no_reason_to_refuse_a_start(tmp_path):
    (tmp_path / "reg" / "step-7").mkdir(parents=True)  # a save cut before its COMMIT
    with _agent(tmp_path, None) as guard:
        assert guard.restore() == 0


SCRIPT = textwrap.dedent(
    """
    import sys, torch
    from powerguard.ckpt_agent import CheckpointAgent
    torch.manual_seed(0)
    guard = CheckpointAgent(job="line", model=torch.nn.Linear(2, 2), local_dir=sys.argv[1], local_every_s=0)
    start = guard.restore()
    guard.save(start + 9)
    guard.close()
    """
)


def test_every_start_says_in_one_line_on_stderr_where_it_resumed(tmp_path):
    """No logging configured (a user's plain script): the line shows all the same."""
    runs = [subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=120)]
    runs.append(
        subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=120)
    )
    assert [r.returncode for r in runs] == [0, 0], runs[-1].stderr
    first = [ln for ln in runs[0].stderr.splitlines() if ln.startswith("powerguard: job line")]
    again = [ln for ln in runs[1].stderr.splitlines() if ln.startswith("powerguard: job line")]
    assert first == [f"powerguard: job line: fresh start at step 0: no checkpoint in {tmp_path}/line"]
    assert again == ["powerguard: job line resumed at step 10 from the local tier's checkpoint of step 9"]
