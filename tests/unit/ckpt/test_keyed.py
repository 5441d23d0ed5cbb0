"""A site checkpoint key end to end in the agent: saves are signed; a restore with the key
loads only what the key signed, and says why it skipped the rest."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from powerguard.ckpt_agent import CheckpointAgent, NoRestorableCheckpoint


def _agent(tmp_path, key_file=None) -> tuple[CheckpointAgent, nn.Module]:
    torch.manual_seed(0)
    model = nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    kw = {"checksum_key_file": key_file} if key_file else {}
    return CheckpointAgent(
        job="k", model=model, optimizer=opt, local_dir=tmp_path / "ckpt", local_every_s=0, **kw
    ), model


def test_a_keyed_restore_loads_only_what_the_key_signed(tmp_path, caplog, monkeypatch):
    key, other = tmp_path / "site.key", tmp_path / "other.key"
    key.write_bytes(b"s" * 32)
    other.write_bytes(b"o" * 32)
    writer, _ = _agent(tmp_path)
    writer.save(3)  # unsigned: written before the site had a key
    writer.close()
    writer, _ = _agent(tmp_path, key)
    writer.save(5)  # signed
    writer.close()
    caplog.set_level(logging.WARNING)
    reader, _ = _agent(tmp_path, key)
    assert reader.restore() == 6
    reader.close()
    stranger, _ = _agent(tmp_path, other)
    with pytest.raises(NoRestorableCheckpoint, match=r"2 committed checkpoint\(s\) and none can be restored"):
        stranger.restore()  # a checkpoint signed with another key, or none, must not load: and never a silent step 0
    stranger.close()
    assert "does not match the job's key" in caplog.text and "not signed with a checkpoint key" in caplog.text
    monkeypatch.setenv("POWERGUARD_CKPT_KEY_FILE", str(key))  # the environment names the key too
    from_env, _ = _agent(tmp_path)
    assert from_env.restore() == 6
    from_env.close()
