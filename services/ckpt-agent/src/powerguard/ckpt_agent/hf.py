"""Hugging Face ``Trainer``: outage-safe training with one callback and one resume argument.

    from powerguard.ckpt_agent.hf import PowerGuardCallback, latest_checkpoint

    trainer = Trainer(..., callbacks=[PowerGuardCallback(job="llama", nats_url=...)])
    trainer.train(resume_from_checkpoint=latest_checkpoint(args.output_dir))

On a power request every rank agrees on one optimizer step and sets ``control.should_save``
there; the ``Trainer`` writes its own checkpoint (``<output_dir>/checkpoint-<N>``: model,
optimizer, scheduler, trainer state, every process's RNG) and the agent fsyncs, hashes, commits
(``COMMIT`` with the manifest) and acks it. Saves of the Trainer's own schedule (``save_steps``)
are committed the same way, unacked, so a resume may pick them too. The Trainer resumes exactly
as it does by itself (it skips the batches already trained on and restores the RNG).
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any

from transformers import TrainerCallback

from powerguard.bus import BusNames

from ._check import CheckMode
from ._framework import env_world_size, resume_point
from ._keys import load_job_keys
from .agent import CheckpointAgent
from .errors import CheckpointError

log = logging.getLogger("powerguard.ckpt_agent")

_CHECKPOINT_DIR = re.compile(r"^checkpoint-(\d+)$")  # the Trainer's PREFIX_CHECKPOINT_DIR


def latest_checkpoint(
    output_dir: str | os.PathLike,
    *,
    job: str | None = None,
    world_size: int | None = None,
    checksum_key_file: str | os.PathLike | None = None,
    reshard: bool = False,
    allow_fresh_start: bool = False,
) -> str | None:
    """The newest committed ``checkpoint-<N>`` under ``output_dir`` whose every byte verifies
    (for ``trainer.train(resume_from_checkpoint=...)``); None when there is none at all. Each
    skipped one (uncommitted, corrupt, another world size) is logged with its reason.

    Committed checkpoints of which none can be restored raise
    :class:`~powerguard.ckpt_agent.NoRestorableCheckpoint` naming the newest and why (a silent
    fresh start would lose the job's training); ``reshard=True`` resumes one of another world
    size (the Trainer's DDP checkpoint holds the whole model and optimizer: they resume exactly;
    the data order is the new world's); ``allow_fresh_start=True`` returns None instead.

    ``job``: the callback's; a checkpoint committed for another job is refused by name. With a
    checkpoint key it is needed (the key that signs is the job's own)."""
    mode = CheckMode.from_env()
    root = mode.framework_root(output_dir)  # `check-resume` / `try`: the check's directory
    job = mode.framework_job(job) if job is not None else None
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        names = []
    candidates = [(int(m.group(1)), os.path.join(root, n)) for n in names if (m := _CHECKPOINT_DIR.match(n))]
    key_file = checksum_key_file or os.environ.get("POWERGUARD_CKPT_KEY_FILE")
    if key_file and job is None:
        raise ValueError(
            "latest_checkpoint(output_dir, job=...): with a checkpoint key, name the job "
            "(its own key signs its checkpoints)"
        )
    found = resume_point(
        candidates,
        framework="hf",
        world_size=world_size if world_size is not None else env_world_size(),
        keys=load_job_keys(key_file, job) if key_file and job else None,
        job=job,
        reshard=reshard,
        allow_fresh_start=allow_fresh_start,
        where=str(root),
    )
    if found is None:
        log.info("no valid committed Trainer checkpoint under %s", root)
        return None
    return found


class PowerGuardCallback(TrainerCallback):
    """The PowerGuard callback (see the module docstring). Keyword-only arguments: ``job``, the
    bus (``nats_url``, ``nats_creds``, ``names``; TLS from ``NATS_CA``/``NATS_CERT``/``NATS_KEY``)
    and any other :class:`CheckpointAgent` option (``node``, ``hold_policy``, ``agree_every_s``,
    ``checksum_key_file``, ...). Checkpoints go where the Trainer puts them (``output_dir``);
    the Trainer's ``save_total_limit`` keeps pruning them."""

    def __init__(
        self,
        *,
        job: str,
        nats_url: str | None = None,
        nats_creds: str | os.PathLike | None = None,
        names: BusNames | None = None,
        **agent_options: Any,
    ) -> None:
        self.job = CheckMode.from_env().framework_job(job)
        self._options = {"nats_url": nats_url, "nats_creds": nats_creds, "names": names, **agent_options}
        self.agent: CheckpointAgent | None = None

    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        mode = CheckMode.from_env()
        if mode.on:  # under `powerguard check-resume` / `try`: the Trainer writes into the check's directory
            args.output_dir = mode.framework_root(args.output_dir)
        return control

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        launched = env_world_size()
        if self.agent is None and launched != args.world_size:
            raise CheckpointError(
                f"the launcher started {launched} processes but the Trainer runs with world_size "
                f"{args.world_size}: {launched} independent trainers, whose checkpoints would be committed as "
                "one job's (on CPU: TrainingArguments(use_cpu=True), or --use_cpu; check the distributed setup)"
            )
        if self.agent is None:
            self.agent = CheckpointAgent(
                job=self.job, model=model, local_dir=args.output_dir, framework="hf", **self._options
            )

        if self.agent is not None:  # resumed: job.resumed names the step and saga (the start's line either way)
            directory = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
            resumed = state.global_step and os.path.isdir(directory)
            self.agent.restored_from(directory if resumed else None, state.global_step)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self.agent is None:
            return control
        self.agent.step(state.global_step)
        if self.agent.due is not None:
            control.should_save = True  # the Trainer saves right after this step, on every rank
        return control

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self.agent is None:
            return control
        directory = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        if self.agent.due is not None:
            self.agent.finish_due(directory)
        else:
            self.agent.commit_saved(directory, state.global_step)
        return control

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self.agent is not None:
            agent, self.agent = self.agent, None
            agent.close()
        return control


__all__ = ["PowerGuardCallback", "latest_checkpoint"]
