"""PyTorch Lightning: outage-safe training with one callback and one resume argument.

    from powerguard.ckpt_agent.lightning import PowerGuardCallback, latest_checkpoint

    trainer = Trainer(..., callbacks=[PowerGuardCallback(job="llama", dirpath="/ckpt", nats_url=...)])
    trainer.fit(model, loader, ckpt_path=latest_checkpoint("/ckpt", job="llama"), weights_only=True)

On a power request every rank agrees on one optimizer step; Lightning writes the checkpoint
(``trainer.save_checkpoint``: loops, callbacks, precision and data-loader state, as Lightning
restores them) into ``<dirpath>/<job>/step-<N>/checkpoint.ckpt``; the agent fsyncs, hashes,
commits and acks it. Every rank's RNG state goes into the checkpoint (this callback's state), so
dropout continues exactly. The data order continues exactly only with a resumable loader
(:class:`ResumableLoader`, or any loader Lightning resumes). Targets ``lightning.pytorch`` when
installed, else ``pytorch_lightning``; :func:`callback_class` gives the class for either.
"""

from __future__ import annotations

import importlib
import logging
import os
import shutil
from typing import Any

import torch

from powerguard.bus import BusNames

from . import _keys as K
from . import _layout as L
from ._check import CheckMode
from ._framework import env_world_size, resume_point
from ._state import _numpy_rng_state, _python_rng_state, _set_numpy_rng_state, _set_python_rng_state
from .agent import CheckpointAgent
from .errors import CheckpointError

log = logging.getLogger("powerguard.ckpt_agent")

CKPT_FILE = "checkpoint.ckpt"


def latest_checkpoint(
    dirpath: str | os.PathLike,
    *,
    job: str,
    world_size: int | None = None,
    checksum_key_file: str | os.PathLike | None = None,
    reshard: bool = False,
    allow_fresh_start: bool = False,
) -> str | None:
    """The newest committed checkpoint of ``job`` under ``dirpath`` whose every byte verifies
    (for ``trainer.fit(ckpt_path=...)``); None when there is none at all. Each skipped one is
    logged with its reason. ``world_size``: default the launcher's (``WORLD_SIZE``).

    Committed checkpoints of which none can be restored (another world size, corrupt, signed with
    another key) raise :class:`~powerguard.ckpt_agent.NoRestorableCheckpoint` naming the newest
    and why, as the agent's ``restore()`` does: a silent fresh start would lose the job's training.
    ``reshard=True`` resumes one of another world size (a DDP checkpoint holds the whole model and
    optimizer: they resume exactly; the data order is the new world's); ``allow_fresh_start=True``
    returns None instead of raising."""
    mode = CheckMode.from_env()  # under `powerguard check-resume` / `try`: the check's directory and job
    root, job = mode.framework_root(dirpath), mode.framework_job(job)
    key_file = checksum_key_file or os.environ.get("POWERGUARD_CKPT_KEY_FILE")
    fs, _ = L.fs_for(root)
    found = resume_point(
        L.list_steps(fs, root, job),
        framework="lightning",
        world_size=world_size if world_size is not None else env_world_size(),
        keys=K.load_job_keys(key_file, job) if key_file else None,
        job=job,
        reshard=reshard,
        allow_fresh_start=allow_fresh_start,
        where=f"{root} (job {job})",
    )
    if found is None:
        log.info("no valid committed Lightning checkpoint of job %s under %s", job, root)
        return None
    return os.path.join(found, CKPT_FILE)


class ResumableLoader:
    """Wraps a sized ``DataLoader`` so that Lightning resumes it mid-epoch at the next batch it
    would have trained on (Lightning saves and restores its ``state_dict``; it does not fetch
    ahead from a loader with a length, so the batches handed out are the batches trained on).
    Skipping on resume reads the skipped batches (works with any loader). The wrapped loader must
    give the same order for the same epoch (a seeded generator or ``DistributedSampler``).

    Lightning gives a plain ``DataLoader`` its ``DistributedSampler`` itself, but not a wrapper:
    in a distributed run the wrapper does it, as Lightning would (``DistributedSampler`` over the
    world, shuffled when the loader shuffled, seed 0), the first time the loader is used, so each
    rank trains on its share of the data (every rank trained on all of it before)."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader
        self._skip = 0
        self._yielded = 0
        self._sharded = False

    def _inner(self) -> Any:
        if not self._sharded:
            self._sharded = True
            self.loader = _distributed(self.loader)
        return self.loader

    def __len__(self) -> int:
        return len(self._inner())

    def __getattr__(self, name: str) -> Any:  # sampler, batch_size, dataset... (Lightning reads them)
        if name in ("loader", "_sharded"):
            raise AttributeError(name)
        return getattr(self._inner(), name)

    def __iter__(self):
        skip, self._skip = self._skip, 0
        self._yielded = 0
        iterator = iter(self._inner())
        for _ in range(skip):
            next(iterator)
            self._yielded += 1
        for batch in iterator:
            self._yielded += 1
            yield batch

    def state_dict(self) -> dict[str, int]:
        return {"consumed": self._yielded}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        consumed = int(state.get("consumed", 0))
        self._skip = consumed if 0 <= consumed < len(self) else 0  # the end of an epoch: a new one


def _distributed(loader: Any) -> Any:
    """``loader`` with a ``DistributedSampler`` over the world (as Lightning injects one into a
    plain ``DataLoader``), or as it is: one process, a sampler of its own already, a batch sampler
    of the user's, or not a ``DataLoader``."""
    import torch.distributed as dist
    from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, RandomSampler

    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return loader
    if not isinstance(loader, DataLoader) or isinstance(loader.sampler, DistributedSampler):
        return loader
    if loader.batch_size is None or type(loader.batch_sampler) is not BatchSampler:
        log.warning("ResumableLoader: the loader has a batch sampler of its own: not sharded over the ranks")
        return loader
    sampler = DistributedSampler(loader.dataset, shuffle=isinstance(loader.sampler, RandomSampler), seed=0)
    return DataLoader(
        loader.dataset,
        batch_size=loader.batch_size,
        sampler=sampler,
        num_workers=loader.num_workers,
        collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory,
        drop_last=loader.drop_last,
        timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn,
        generator=loader.generator,
        persistent_workers=loader.persistent_workers,
        **({"prefetch_factor": loader.prefetch_factor} if loader.num_workers else {}),
    )


def _rng_state() -> dict[str, Any]:
    """This process's RNG states: tensors and plain values (a ``weights_only`` load reads them)."""
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": _python_rng_state(),
        "numpy": _numpy_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    _set_python_rng_state(state["python"])
    _set_numpy_rng_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


_classes: dict[str, type] = {}


def callback_class(package: str = "") -> type:
    """The callback class for ``package`` (``"lightning.pytorch"`` or ``"pytorch_lightning"``;
    default: the first one installed). Lightning accepts only its own package's callbacks."""
    for name in [package] if package else ["lightning.pytorch", "pytorch_lightning"]:
        try:
            base = importlib.import_module(name).Callback
        except ImportError:
            continue
        return _classes.setdefault(name, type("PowerGuardCallback", (_Callback, base), {"__module__": __name__}))
    raise ImportError(
        "PowerGuardCallback needs lightning or pytorch_lightning: pip install powerguard-ckpt-agent[lightning]"
    )


class _Callback:
    """The PowerGuard callback (see the module docstring). Keyword-only arguments: ``job`` and
    ``dirpath`` (the shared checkpoint directory every rank sees), the bus (``nats_url``,
    ``nats_creds``, ``names``; TLS from ``NATS_CA``/``NATS_CERT``/``NATS_KEY``), ``keep``
    (committed checkpoints kept), and any other :class:`CheckpointAgent` option (``node``,
    ``hold_policy``, ``agree_every_s``, ``checksum_key_file``, ...)."""

    def __init__(
        self,
        *,
        job: str,
        dirpath: str | os.PathLike,
        nats_url: str | None = None,
        nats_creds: str | os.PathLike | None = None,
        names: BusNames | None = None,
        keep: int = 3,
        **agent_options: Any,
    ) -> None:
        super().__init__()
        mode = CheckMode.from_env()  # under `powerguard check-resume` / `try`: the check's directory and job
        self.job, self.dirpath = mode.framework_job(job), mode.framework_root(dirpath)
        self._options = {"nats_url": nats_url, "nats_creds": nats_creds, "names": names, "keep": keep, **agent_options}
        self.agent: CheckpointAgent | None = None
        self._last_step: int | None = None
        self._rank = 0
        self._rngs: list[dict[str, Any]] | None = None  # every rank's RNG, while a checkpoint is written
        self._resume_rng: dict[str, Any] | None = None  # this rank's, restored at the first batch after a resume

    @property
    def state_key(self) -> str:
        return f"PowerGuardCallback[{self.job}]"

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit" or self.agent is not None:
            return
        self._rank = trainer.global_rank
        self.agent = CheckpointAgent(
            job=self.job, model=pl_module, local_dir=self.dirpath, framework="lightning", **self._options
        )

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if self.agent is not None:  # restored: job.resumed names the step and saga (the start's line either way)
            path = os.path.dirname(os.fspath(trainer.ckpt_path)) if trainer.ckpt_path else None
            self.agent.restored_from(path, trainer.global_step)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = trainer.global_step
        if self.agent is None or step == self._last_step:  # gradient accumulation: optimizer steps only
            return
        self._last_step = step
        self.agent.step(step)
        if self.agent.due is not None:
            self._save(trainer)

    def _save(self, trainer: Any) -> None:
        """Lightning writes the due checkpoint; the agent commits and acks it (never raises).
        Every rank takes the same path through the collectives whatever fails where."""
        agent = self.agent
        directory = L.step_dir(agent.local_root, self.job, agent.due.step)
        problem = None
        if self._rank == 0:
            try:
                if os.path.isdir(directory) and not os.path.exists(os.path.join(directory, L.COMMIT)):
                    shutil.rmtree(directory)  # an uncommitted leftover of a save cut short
                L.makedirs_durable(directory)
            except OSError as exc:
                problem = f"rank 0: cannot prepare {directory}: {exc}"
        answers = agent.gather((problem, _rng_state()))
        problems = [p for p, _ in answers if p]
        error: BaseException | None = CheckpointError("; ".join(problems)) if problems else None
        if error is None:
            self._rngs = [rng for _, rng in answers]
            try:
                trainer.save_checkpoint(os.path.join(directory, CKPT_FILE))
            except Exception as exc:
                error = exc
                try:  # the other ranks wait in save_checkpoint's barrier: meet them there
                    trainer.strategy.barrier("Trainer.save_checkpoint")
                except Exception as barrier_exc:
                    log.warning("rank %d: barrier after a failed save: %s", self._rank, barrier_exc)
            finally:
                self._rngs = None
        agent.finish_due(directory, error, retain=True)

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self._rngs} if self._rngs is not None else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Keep this rank's RNG for the first training batch: Lightning builds the sanity check's
        and the training's loader iterators after it loads the checkpoint, and an iterator of a
        ``DataLoader`` without a generator of its own draws its base seed from the global RNG (the
        interrupted run drew those before the checkpoint): restored now, a dropout mask would
        differ from the uninterrupted run's."""
        rngs = state_dict.get("rng")
        if isinstance(rngs, list) and self._rank < len(rngs):
            self._resume_rng = rngs[self._rank]

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        rng, self._resume_rng = self._resume_rng, None
        if rng is not None:
            _set_rng_state(rng)
            log.info("rank %d: RNG state restored from the checkpoint", self._rank)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if self.agent is not None and stage == "fit":
            agent, self.agent = self.agent, None
            agent.close()


PowerGuardCallback = callback_class()  # lightning.pytorch's when installed, else pytorch_lightning's


__all__ = ["CKPT_FILE", "PowerGuardCallback", "ResumableLoader", "callback_class", "latest_checkpoint"]
