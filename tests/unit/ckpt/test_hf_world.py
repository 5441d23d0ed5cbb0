"""The HF callback refuses independent trainers that a launcher started as one job: transformers on
CPU without ``use_cpu`` ran two single-process Trainers under torchrun, and the callback committed
their checkpoints as one 2-rank checkpoint."""

from __future__ import annotations

import pytest

from tests.conftest import require_module

require_module("transformers", "hf")


def test_a_trainer_that_did_not_join_the_launchers_world_is_refused_naming_the_fix(tmp_path, monkeypatch):
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from powerguard.ckpt_agent import CheckpointError
    from powerguard.ckpt_agent.hf import PowerGuardCallback

    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    assert args.world_size == 1  # this one trains alone ...
    monkeypatch.setenv("WORLD_SIZE", "2")  # ... though torchrun started two processes
    callback = PowerGuardCallback(job="j")
    with pytest.raises(CheckpointError, match=r"started 2 processes but the Trainer runs with world_size 1.*use_cpu"):
        callback.on_train_begin(args, TrainerState(), TrainerControl(), model=None)
    assert callback.agent is None
