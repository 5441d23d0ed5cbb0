"""Framework-written checkpoints: committed with a manifest, found for a resume only when every
byte verifies; a corrupt, uncommitted or foreign newest one is skipped with the reason."""

from __future__ import annotations

import io
import json
import logging

import numpy as np
import pytest
import torch

from powerguard.ckpt_agent import CommitError, NoRestorableCheckpoint
from powerguard.ckpt_agent._framework import commit_directory, newest_valid, verify_directory
from powerguard.ckpt_agent._keys import job_key, load_key
from powerguard.ckpt_agent.lightning import latest_checkpoint


def _saved(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _write(root, job, step, payload: bytes, *, framework="lightning", commit=True):
    """A checkpoint as the framework writes it: torch.save's zip format."""
    d = root / job / f"step-{step}"
    d.mkdir(parents=True)
    (d / "checkpoint.ckpt").write_bytes(_saved({"state": payload}))
    if commit:
        commit_directory(str(d), job=job, step=step, world_size=2, framework=framework, saga_id="s1")
    return d


def test_the_newest_corrupt_checkpoint_is_skipped_with_the_reason(tmp_path, caplog):
    _write(tmp_path, "j", 10, b"a" * 1000)
    newest = _write(tmp_path, "j", 20, b"b" * 1000)
    data = bytearray((newest / "checkpoint.ckpt").read_bytes())
    data[len(data) // 2] ^= 1
    (newest / "checkpoint.ckpt").write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="powerguard.ckpt_agent"):
        found = latest_checkpoint(tmp_path, job="j", world_size=2)
    assert found == str(tmp_path / "j" / "step-10" / "checkpoint.ckpt")
    assert "step-20" in caplog.text and "checksum mismatch" in caplog.text


def test_uncommitted_foreign_and_other_world_size_checkpoints_are_not_resumed(tmp_path, caplog):
    _write(tmp_path, "j", 5, b"ok")
    _write(tmp_path, "j", 6, b"cut short", commit=False)
    _write(tmp_path, "j", 7, b"hf", framework="hf")
    with caplog.at_level(logging.WARNING, logger="powerguard.ckpt_agent"):
        assert latest_checkpoint(tmp_path, job="j", world_size=2).endswith("step-5/checkpoint.ckpt")
        assert latest_checkpoint(tmp_path, job="j", world_size=4, allow_fresh_start=True) is None
    assert "no COMMIT" in caplog.text and "not a lightning checkpoint" in caplog.text
    assert "written by 2 ranks, this job has 4" in caplog.text


@pytest.mark.parametrize("framework", ["lightning", "hf"])
def test_committed_checkpoints_none_restorable_are_refused_by_name_not_a_silent_fresh_start(tmp_path, framework):
    """A 2-rank job's checkpoints, the job restarted on 1 rank: it was a WARNING and a "fresh
    start at step 0" (exit 0, the training lost); now NoRestorableCheckpoint names the newest,
    why, and the way out; reshard=True resumes it (the whole DDP state), and with nothing
    committed at all a first start is still None."""
    from powerguard.ckpt_agent.hf import latest_checkpoint as hf_latest

    def latest(**kw):
        if framework == "lightning":
            return latest_checkpoint(tmp_path, job="j", **kw)
        return hf_latest(tmp_path, **kw)

    assert latest(world_size=1) is None  # nothing committed: a first start
    for step in (5, 8):
        d = _checkpoint_dir(tmp_path, framework, step)
        name = "checkpoint.ckpt" if framework == "lightning" else "pytorch_model.bin"
        (d / name).write_bytes(_saved({"w": torch.ones(2)}))
        commit_directory(str(d), job="j", step=step, world_size=2, framework=framework)
    with pytest.raises(
        NoRestorableCheckpoint,
        match=r"2 committed .* none can be restored; the newest: .*-8.*"
        r"written by 2 ranks, this job has 1.*reshard=True",
    ):
        latest(world_size=1)
    assert "-8" in latest(world_size=1, reshard=True)
    assert latest(world_size=1, allow_fresh_start=True) is None


def test_commit_lists_every_file_and_refuses_a_subdirectory(tmp_path):
    d = _write(tmp_path, "j", 3, b"x" * 10)
    commit = json.loads((d / "COMMIT").read_text())
    assert commit["framework"] == "lightning" and commit["saga_id"] == "s1" and commit["step"] == 3
    verify_directory(str(d), framework="lightning", world_size=2)
    (d / "extra").write_bytes(b"not in the manifest")  # a file added later is not trusted, only listed ones
    assert newest_valid([(3, str(d))], framework="lightning", world_size=2) == (3, str(d))
    sub = tmp_path / "k" / "step-1"
    (sub / "nested").mkdir(parents=True)
    with pytest.raises(CommitError, match="not a plain file"):
        commit_directory(str(sub), job="k", step=1, world_size=1, framework="hf")


def test_a_keyed_commit_is_refused_without_the_site_key_match(tmp_path):
    key_file = tmp_path / "key"
    key_file.write_bytes(b"k" * 32)
    d = tmp_path / "j" / "step-1"
    d.mkdir(parents=True)
    (d / "checkpoint.ckpt").write_bytes(_saved({"w": torch.ones(2)}))
    commit_directory(str(d), job="j", step=1, world_size=1, framework="lightning", key=job_key(load_key(key_file), "j"))
    assert latest_checkpoint(tmp_path, job="j", world_size=1, checksum_key_file=key_file)
    other = tmp_path / "other"
    other.write_bytes(b"o" * 32)
    with pytest.raises(NoRestorableCheckpoint, match="signature does not match the job's key"):
        latest_checkpoint(tmp_path, job="j", world_size=1, checksum_key_file=other)


class _RunsCode:
    """A pickle that, loaded, creates a file (a stand-in for any code)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _checkpoint_dir(root, framework: str, step: int):
    d = root / "j" / f"step-{step}" if framework == "lightning" else root / f"checkpoint-{step}"
    d.mkdir(parents=True)
    return d


@pytest.mark.parametrize("framework", ["lightning", "hf"])
def test_13_a_forged_framework_file_is_never_offered_for_resume_and_the_previous_one_is(tmp_path, caplog, framework):
    """Without a site key, a forger rewrites a file the framework loads (Lightning's .ckpt, the
    Trainer's optimizer.pt) as a pickle that runs code and re-commits (the manifest recomputed):
    the checkpoint verifies byte by byte, and is still refused with the reason, never loaded."""
    from powerguard.ckpt_agent.hf import latest_checkpoint as hf_latest

    marker = tmp_path / "code-ran"
    name = "checkpoint.ckpt" if framework == "lightning" else "optimizer.pt"
    for step in (10, 20):
        d = _checkpoint_dir(tmp_path, framework, step)
        if framework == "hf":  # the Trainer's RNG state holds NumPy's: admitted
            rng = {
                "python": __import__("random").getstate(),
                "numpy": np.random.get_state(),
                "cpu": torch.get_rng_state(),
            }
            (d / "rng_state.pth").write_bytes(_saved(rng))
        payload = {"step": step, "w": torch.arange(4.0)} if step == 10 else _RunsCode(str(marker))
        (d / name).write_bytes(_saved(payload))
        commit_directory(str(d), job="j", step=step, world_size=1, framework=framework)
    with caplog.at_level(logging.WARNING, logger="powerguard.ckpt_agent"):
        if framework == "lightning":
            found = latest_checkpoint(tmp_path, job="j", world_size=1)
        else:
            found = hf_latest(tmp_path, world_size=1)
    assert found is not None and "-10" in found, found
    assert "io.open" in caplog.text and "not loaded, no code runs" in caplog.text, caplog.text
    assert not marker.exists()
    assert torch.load(found if framework == "lightning" else f"{found}/{name}", weights_only=True)["step"] == 10
