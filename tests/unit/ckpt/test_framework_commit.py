"""Framework-written checkpoints: committed with a manifest, found for a resume only when every
byte verifies; a corrupt, uncommitted or foreign newest one is skipped with the reason."""

from __future__ import annotations

import json
import logging

import pytest

from powerguard.ckpt_agent import CommitError
from powerguard.ckpt_agent._framework import commit_directory, newest_valid, verify_directory
from powerguard.ckpt_agent._layout import load_key
from powerguard.ckpt_agent.lightning import latest_checkpoint


def _write(root, job, step, payload: bytes, *, framework="lightning", commit=True):
    d = root / job / f"step-{step}"
    d.mkdir(parents=True)
    (d / "checkpoint.ckpt").write_bytes(payload)
    if commit:
        commit_directory(str(d), step=step, world_size=2, framework=framework, saga_id="s1")
    return d


def test_the_newest_corrupt_checkpoint_is_skipped_with_the_reason(tmp_path, caplog):
    _write(tmp_path, "j", 10, b"a" * 1000)
    newest = _write(tmp_path, "j", 20, b"b" * 1000)
    data = bytearray((newest / "checkpoint.ckpt").read_bytes())
    data[500] ^= 1
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
        assert latest_checkpoint(tmp_path, job="j", world_size=4) is None
    assert "no COMMIT" in caplog.text and "not a lightning checkpoint" in caplog.text
    assert "written by 2 ranks, this job has 4" in caplog.text


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
        commit_directory(str(sub), step=1, world_size=1, framework="hf")


def test_a_keyed_commit_is_refused_without_the_site_key_match(tmp_path):
    key_file = tmp_path / "key"
    key_file.write_bytes(b"k" * 32)
    d = tmp_path / "j" / "step-1"
    d.mkdir(parents=True)
    (d / "checkpoint.ckpt").write_bytes(b"weights")
    commit_directory(str(d), step=1, world_size=1, framework="lightning", key=load_key(key_file))
    assert latest_checkpoint(tmp_path, job="j", world_size=1, checksum_key_file=key_file)
    other = tmp_path / "other"
    other.write_bytes(b"o" * 32)
    assert latest_checkpoint(tmp_path, job="j", world_size=1, checksum_key_file=other) is None
