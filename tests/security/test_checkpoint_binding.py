"""Threat: whoever can write a checkpoint tier (a file copy, no key) moves a checkpoint to another
job or another step, or hides the newer ones so that an older one is restored; a job's container
holding a key signs a checkpoint for another job. A checkpoint is bound to its job, step and tier
(COMMIT says so, under the key's MAC with a key); a restore refuses by name what is not the job's
own at that step, and never picks a step older than the one the coordinator recorded as acked by
every rank unless the operator names it. With the real agent (one rank, a real process group)
and, for the record, the shipped nats-server with the deployment's credentials.

Before: another job's signed step 7 copied to ``victim/step-900`` was restored into the victim,
and the victim's own step 2 copied to ``step-901`` rolled the job back."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys

import pytest
import torch
from torch import nn

from powerguard.ckpt_agent import CheckpointAgent, NoRestorableCheckpoint
from powerguard.ckpt_agent import _keys as K
from powerguard.ckpt_agent import _layout as L
from powerguard.ckpt_agent.errors import CheckpointError
from powerguard.schemas import CheckpointRecorded, RecordedData

from .conftest import refused


def _agent(root, job: str, fill: float, **kw) -> tuple[CheckpointAgent, nn.Module]:
    torch.manual_seed(0)
    model = nn.Linear(8, 4)
    with torch.no_grad():
        model.weight.fill_(fill)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return CheckpointAgent(job=job, model=model, optimizer=opt, local_dir=root, local_every_s=0, **kw), model


def _saved(root, job: str, steps: dict[int, float], **kw) -> None:
    """``job`` saves each step with its weights filled with the given value."""
    for step, fill in steps.items():
        agent, _ = _agent(root, job, fill, **kw)
        agent.save(step)
        agent.close()


@pytest.mark.parametrize("keyed", [False, True], ids=["no key", "site key"])
def test_another_jobs_checkpoint_or_another_step_copied_in_is_refused_by_name(tmp_path, caplog, keyed):
    root = tmp_path / "ckpt"
    kw = {}
    if keyed:
        (tmp_path / "site.key").write_bytes(b"s" * 32)
        kw = {"checksum_key_file": tmp_path / "site.key"}
    _saved(root, "victim", {2: 2.0, 5: 5.0}, **kw)
    _saved(root, "other", {7: 7.0}, **kw)
    shutil.copytree(root / "other" / "step-7", root / "victim" / "step-900")  # a file copy, no key
    shutil.copytree(root / "other" / "step-7", root / "victim" / "step-7")  # under its own step's name
    shutil.copytree(root / "victim" / "step-2", root / "victim" / "step-901")
    caplog.set_level(logging.WARNING)
    reader, model = _agent(root, "victim", 0.0, **kw)
    assert reader.restore() == 6  # its own newest, step 5
    reader.close()
    assert torch.all(model.weight == 5.0)
    assert "step-900: job 'other''s checkpoint, not job 'victim''s" in caplog.text
    assert "step-7: job 'other''s checkpoint, not job 'victim''s" in caplog.text
    assert "holds step 2, stored as step 901" in caplog.text


def test_a_jobs_own_key_cannot_sign_for_another_job(tmp_path, caplog):
    """Each job's container holds only its own key (`powerguard ckpt-key issue`): with it a
    container can write a checkpoint that names the victim, but not one the victim's key verifies."""
    site = tmp_path / "site.key"
    site.write_bytes(b"s" * 32)
    keys = {}
    for job in ("victim", "other"):
        keys[job] = tmp_path / f"{job}.key"
        issue = ["ckpt-key", "issue", "--job", job, "--site-key", str(site), "--out", str(keys[job])]
        out = subprocess.run(
            [sys.executable, "-m", "powerguard.cli", *issue],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr
        assert keys[job].stat().st_mode & 0o777 == 0o600
    root = tmp_path / "ckpt"
    _saved(root, "victim", {5: 5.0}, checksum_key_file=keys["victim"])
    # "other"'s container, with its own key, writes a checkpoint naming the victim
    forged = K.job_key(K.load_key(tmp_path / "site.key"), "other")
    src = root / "victim" / "step-5"
    dst = root / "victim" / "step-9"
    shutil.copytree(src, dst)
    commit = L.read_commit(L.fs_for(str(dst))[0], str(dst))
    body = {k: v for k, v in commit.items() if k not in ("mac", "created")} | {"step": 9}
    body["keyed"] = dict(body["keyed"])
    body["mac"] = L._mac(forged, body)  # what the attacker computes with its own key
    (dst / "COMMIT").write_text(json.dumps(body, sort_keys=True))
    caplog.set_level(logging.WARNING)
    reader, model = _agent(root, "victim", 0.0, checksum_key_file=keys["victim"])
    assert reader.restore() == 6
    reader.close()
    assert torch.all(model.weight == 5.0)
    assert "COMMIT signature does not match the job's key" in caplog.text
    with pytest.raises(CheckpointError, match="is job 'other''s, not 'victim''s"):
        _agent(root, "victim", 0.0, checksum_key_file=keys["other"])  # a container given another job's key


async def test_no_rollback_past_the_step_the_coordinator_recorded(deployment, tmp_path, caplog):
    dep = deployment
    root = tmp_path / "ckpt"
    _saved(root, "jobA", {3: 3.0, 5: 5.0})
    step5 = root / "jobA" / "step-5"
    acked = L.commit_id(L.read_commit(L.fs_for(str(step5))[0], str(step5)))
    coordinator = await dep.connect("coordinator")
    await coordinator.publish(CheckpointRecorded(data=RecordedData(job="jobA", saga_id="s-1", step=5, commit=acked)))
    # the job's own credential cannot say what the coordinator recorded (a floor of its choosing)
    job = await dep.connect("agent", job="jobA")
    why = await refused(job.publish(CheckpointRecorded(data=RecordedData(job="jobA", step=1))))
    assert "ermission" in why or "Timeout" in why, why

    bus = {
        "nats_url": dep.url,
        "names": dep.names,
        "nats_creds": dep.creds_of("agent", job="jobA"),
    }
    # the newest checkpoint hidden (removed from the tier): step 3 would roll the job back
    hidden = tmp_path / "hidden-step-5"
    shutil.move(step5, hidden)
    caplog.set_level(logging.WARNING)
    reader, _ = _agent(root, "jobA", 0.0, **bus)
    with pytest.raises(NoRestorableCheckpoint, match="step 3 is older than step 5, which the coordinator recorded"):
        reader.restore()
    reader.close()
    # step 5 rewritten with other contents under its own name: not the checkpoint the acks named
    _saved(root, "jobA", {5: 50.0})
    reader, _ = _agent(root, "jobA", 0.0, **bus)
    with pytest.raises(NoRestorableCheckpoint, match="not the checkpoint of step 5 the job's acks named"):
        reader.restore()
    reader.close()
    # the operator names the older step: restored
    shutil.rmtree(step5)
    reader, model = _agent(root, "jobA", 0.0, allow_rollback=3, **bus)
    assert reader.restore() == 4
    reader.close()
    assert torch.all(model.weight == 3.0)
    # the acked checkpoint back in place: restored, no rollback needed
    shutil.move(hidden, step5)
    reader, model = _agent(root, "jobA", 0.0, **bus)
    assert reader.restore() == 6
    reader.close()
    assert torch.all(model.weight == 5.0)
