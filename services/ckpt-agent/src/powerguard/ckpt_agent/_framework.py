"""Checkpoints written by a training framework (Lightning, the Hugging Face ``Trainer``) made
durable and committed the PowerGuard way, and the newest valid one found for a resume.

The agent agrees on the step as always; instead of saving itself it leaves the request *due*
(:attr:`CheckpointAgent.due`); the framework's callback has the framework write its own
checkpoint into a directory, then calls :meth:`CheckpointAgent.finish_due` on every rank: rank 0
fsyncs and hashes every file, writes one manifest and ``COMMIT`` (with the framework's name), and
every rank acks (or answers ``ckpt.failed`` with the reason).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

from powerguard.schemas import CheckpointRequestData

from . import _keys as K
from . import _layout as L
from . import _spans
from ._acks import Acks, Saved
from ._agreement import Agreed
from ._framework_files import check_framework_files
from ._ranks import Ranks
from .errors import CheckpointError, CommitError, CorruptCheckpoint, NoRestorableCheckpoint, OtherWorldSize

log = logging.getLogger("powerguard.ckpt_agent")


@dataclass
class Due:
    """A request the ranks agreed to checkpoint at ``step``; the framework writes it."""

    step: int
    requests: list[CheckpointRequestData]
    agree_s: float
    span: Any
    watchdog: threading.Timer | None = None
    finished: bool = False

    @property
    def pause(self) -> bool:
        return any(r.then == "pause" for r in self.requests)

    @property
    def deadline_ts(self) -> float | None:
        return min((r.deadline.timestamp() for r in self.requests), default=None)


def commit_directory(
    directory: str,
    *,
    job: str,
    step: int,
    world_size: int,
    framework: str,
    key: bytes | None = None,
    saga_id: str | None = None,
) -> tuple[str, int]:
    """fsync and hash every file of a framework's checkpoint directory, write its manifest and
    ``COMMIT`` durably (one process: the files of every rank are in the directory). Returns the
    manifest's digest and the bytes listed. Raises :class:`CommitError` naming what failed."""
    fs, _ = L.fs_for(directory)
    try:
        names = sorted(os.listdir(directory))
    except OSError as exc:
        raise CommitError(f"{directory}: cannot list the checkpoint: {exc}") from None
    files: dict[str, dict[str, Any]] = {}
    for name in names:
        if name == L.COMMIT or name.startswith("manifest-") or name.endswith(".tmp"):
            continue
        path = os.path.join(directory, name)
        if not os.path.isfile(path) or os.path.islink(path):
            raise CommitError(f"{path}: not a plain file (sub-directories and links are not committed)")
        try:
            with open(path, "rb") as f:
                os.fsync(f.fileno())
            size, digest, keyed = L.hash_file(fs, path, key)
        except OSError as exc:
            raise CommitError(f"{path}: {exc}") from None
        files[name] = {"size": size, "xxh3": digest, **({K.KEYED: keyed} if keyed else {})}
    if not files:
        raise CommitError(f"{directory}: the framework wrote no file")
    try:
        L.fsync_dir(directory)
        L.fsync_ancestors(directory)  # the framework made the directories: their names too
        digest, nbytes, keyed = L.write_manifest(fs, directory, 0, step, files, key=key)
        L.write_commit(
            fs,
            directory,
            job=job,
            tier="local",
            step=step,
            world_size=world_size,
            digests={0: digest},
            metadata_digest=L.digest_bytes(b""),
            extra={"framework": framework, **({"saga_id": saga_id} if saga_id else {})},
            key=key,
            keyed_manifests={0: keyed} if key is not None else None,
            metadata=b"" if key is not None else None,
        )
    except OSError as exc:
        raise CommitError(f"{directory}: COMMIT not written: {exc}") from None
    return digest, nbytes


def verify_directory(
    directory: str,
    *,
    framework: str,
    world_size: int | None,
    keys: K.Keys | None = None,
    job: str | None = None,
    step: int | None = None,
) -> None:
    """Raise :class:`CorruptCheckpoint` with the reason unless ``directory`` holds a committed
    checkpoint of ``framework`` whose every file matches its manifest (and, with a key, whose
    COMMIT the job's key signed), written for ``job`` and ``step`` (None: not checked), and whose
    files the framework loads name no code (with or without a key: :mod:`._framework_files`)."""
    fs, _ = L.fs_for(directory)
    commit = L.read_commit(fs, directory)
    L.check_binding(commit, job=job, step=step, tier="local", where=directory)
    key = keys.for_commit(commit, directory) if keys is not None else None
    L.authenticate(commit, key, directory)
    if commit.get("framework") != framework:
        raise CorruptCheckpoint(f"{directory}: not a {framework} checkpoint (COMMIT says {commit.get('framework')!r})")
    if world_size is not None and commit.get("world_size") != world_size:
        raise OtherWorldSize(f"{directory}: written by {commit.get('world_size')} ranks, this job has {world_size}")
    try:
        files = L.manifest_files(fs, directory, commit, key)
        L.verify_files(fs, directory, files, sorted(files), key)
    except (OSError, KeyError, ValueError) as exc:
        raise CorruptCheckpoint(f"{directory}: {exc}") from None
    if os.path.isdir(directory):  # the framework loads them from a local directory
        check_framework_files(directory, framework)


def newest_valid(
    candidates: list[tuple[int, str]],
    *,
    framework: str,
    world_size: int | None,
    keys: K.Keys | None = None,
    job: str | None = None,
) -> tuple[int, str] | None:
    """The newest ``(step, directory)`` of ``candidates`` that verifies; every one skipped is
    logged with its reason (a warning: an operator wants to know a checkpoint was bad)."""
    found, _ = _newest(candidates, framework=framework, world_size=world_size, keys=keys, job=job)
    return found


def _newest(
    candidates: list[tuple[int, str]], *, framework: str, world_size: int | None, keys: K.Keys | None, job: str | None
) -> tuple[tuple[int, str] | None, list[tuple[str, CheckpointError]]]:
    """(the newest that verifies, every committed one refused before it: (directory, why))."""
    refused: list[tuple[str, CheckpointError]] = []
    for step, directory in sorted(candidates, reverse=True):
        try:
            verify_directory(directory, framework=framework, world_size=world_size, keys=keys, job=job, step=step)
        except CheckpointError as exc:
            log.warning("skipping checkpoint %s: %s", directory, exc)
            if os.path.exists(os.path.join(directory, L.COMMIT)):
                refused.append((directory, exc))
            continue
        log.info("resuming from %s (step %d): committed, every file verified", directory, step)
        return (step, directory), refused
    return None, refused


def resume_point(
    candidates: list[tuple[int, str]],
    *,
    framework: str,
    world_size: int,
    keys: K.Keys | None,
    job: str | None,
    reshard: bool,
    allow_fresh_start: bool,
    where: str,
) -> str | None:
    """The checkpoint a framework job resumes from, with the promises of every integration: the
    newest committed one of this world size that verifies; with ``reshard``, else the newest of
    another world size that verifies (a framework's DDP checkpoint holds the whole model and
    optimizer: they resume exactly, the data order is the new world's); None when there is no
    committed checkpoint at all. Committed ones that none of these can restore raise
    :class:`NoRestorableCheckpoint` naming the newest and why (a silent step 0 would throw the
    job's training away), unless ``allow_fresh_start``."""
    found, refused = _newest(candidates, framework=framework, world_size=world_size, keys=keys, job=job)
    if found is not None:
        return found[1]
    if reshard:
        other, _ = _newest(candidates, framework=framework, world_size=None, keys=keys, job=job)
        if other is not None:
            log.warning(
                "resuming the %s checkpoint %s of another world size on %d rank(s) (reshard): the model and the "
                "optimizer exactly; the data order and the other ranks' RNG are this world's",
                framework,
                other[1],
                world_size,
            )
            return other[1]
    if refused and not allow_fresh_start:
        why = refused[0][1]
        hint = "reshard=True resumes it on this world size" if isinstance(why, OtherWorldSize) else "fix the cause"
        raise NoRestorableCheckpoint(
            f"{len(refused)} committed {framework} checkpoint(s) under {where} and none can be restored; the "
            f"newest: {why}. Training from step 0 would lose them: {hint}, or pass allow_fresh_start=True"
        )
    return None


def env_world_size() -> int:
    """The job's world size before ``torch.distributed`` is up (torchrun and Slurm set it)."""
    for name in ("WORLD_SIZE", "SLURM_NTASKS"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return 1


class FrameworkSaves:
    """The checkpoint a framework must write (:attr:`due`), its deadline's watchdog, and the
    commit of what the framework wrote (rank 0 commits, every rank gets the result)."""

    def __init__(self, ranks: Ranks, acks: Acks, *, job: str, framework: str, key: bytes | None) -> None:
        self.ranks, self.acks, self.job, self.framework, self.key = ranks, acks, job, framework, key
        self.due: Due | None = None

    def defer(self, step: int, agreed: Agreed) -> Due:
        """The agreed request becomes due instead of the agent saving."""
        due = Due(step, agreed.requests, agreed.agree_s, agreed.span)
        left = due.deadline_ts - time.time() if due.deadline_ts is not None else None
        if left is not None and left > 0:  # (a deadline already past means "now": no watchdog)
            due.watchdog = threading.Timer(left, self._overdue, args=(due,))
            due.watchdog.daemon = True
            due.watchdog.start()
        self.due = due
        return due

    def _overdue(self, due: Due) -> None:
        """The deadline passed while the framework still writes: answer ``ckpt.failed`` now (the
        coordinator must not wait on a save that may never end); the one answer per request is
        this one, even if the checkpoint commits later (a resume may still use it)."""
        if due.finished:
            return
        self.acks.failed(
            due.requests,
            CheckpointError(
                f"rank {self.ranks.rank}: the {self.framework} checkpoint of step {due.step} was not durable by "
                "the request's deadline (the framework is still writing it)"
            ),
            step=due.step,
        )

    def take(self) -> Due | None:
        """The due checkpoint, now being finished (its watchdog stopped); None when none is due."""
        due, self.due = self.due, None
        if due is not None:
            due.finished = True
            if due.watchdog is not None:
                due.watchdog.cancel()
        return due

    def commit(self, directory: str, step: int, saga_id: str | None, error: BaseException | None) -> tuple[str, int]:
        """Every rank: all ranks' errors gathered (the barrier after the framework's write), then
        rank 0 commits the directory; every rank gets (manifest digest, bytes). Raises
        :class:`CheckpointError`."""
        rank = self.ranks.rank
        problems = [p for p in self.ranks.gather(f"rank {rank}: {error!r}" if error else None) if p]
        if problems:
            raise CheckpointError(f"the {self.framework} checkpoint of step {step} failed: {'; '.join(problems)}")
        result: tuple[str, int] | str = ("", 0)
        if rank == 0:
            try:
                result = commit_directory(
                    directory,
                    job=self.job,
                    step=step,
                    world_size=self.ranks.world_size,
                    framework=self.framework,
                    key=self.key,
                    saga_id=saga_id,
                )
            except CheckpointError as exc:
                result = str(exc)
        result = self.ranks.gather(result)[0]
        if isinstance(result, str):
            raise CommitError(result)
        return result

    def finish(self, due: Due, directory: str, error: BaseException | None) -> Saved | None:
        """Every rank: commit the due checkpoint the framework wrote into ``directory`` (or failed
        to: ``error``) and answer its requests; what was saved, or None (answered ``failed``)."""
        t0 = time.perf_counter()
        saved = None
        try:
            saga = next((r.saga_id for r in due.requests if r.saga_id), None)
            digest, nbytes = self.commit(directory, due.step, saga, error)
            t_end = time.perf_counter()
            rank = self.ranks.rank
            contents = L.contents_id(self.job, due.step, self.ranks.world_size, {"0": digest})
            saved = Saved(
                directory, nbytes if rank == 0 else 0, digest, 0.0, t_end - t0, t_end - t0, due.agree_s, commit=contents
            )
            log.info("rank %d: %s checkpoint of step %d committed in %s", rank, self.framework, due.step, directory)
            due.span.set_attribute("powerguard.bytes", nbytes)
            self.acks.durable(due.requests, due.step, saved, ctx=_spans.inside(due.span))
        except CheckpointError as exc:
            _spans.failed(due.span, exc)
            self.acks.failed(due.requests, exc, step=due.step, ctx=_spans.inside(due.span))
        finally:
            due.span.end()
        return saved
