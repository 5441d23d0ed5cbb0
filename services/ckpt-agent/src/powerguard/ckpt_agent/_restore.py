"""Restore: the newest committed checkpoint that verifies (the node tier's own disks first,
then the local tier, then remote), loaded bit-exact; and the ``job.resumed`` announcement
naming the saga it ends. :class:`Restorer` returns what it restored (:class:`Restored`);
nothing here writes the agent's progress."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Protocol

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from powerguard.schemas import JobData, JobResumed

from . import _keys as K
from . import _layout as L
from . import _spans
from ._loading import SafeLoadPlanner, VerifyingReader, precheck_sizes
from ._metadata import SafeFileSystemReader, SafeFsspecReader, check_metadata
from ._ranks import Ranks
from ._state import TrainingState
from .errors import CheckpointError, CorruptCheckpoint, NoRestorableCheckpoint

log = logging.getLogger("powerguard.ckpt_agent")


@dataclass(frozen=True)
class Restored:
    """A checkpoint loaded into the training's objects."""

    step: int  # the step it holds (training goes on at step + 1)
    tier: str  # local | remote | peer (node tier: files fetched from other nodes)
    saga_id: str | None  # the saga whose request made it (its COMMIT says; rank 0 only)
    seconds: float  # loading it


@dataclass(frozen=True)
class Floor:
    """What the coordinator recorded for the job (its ``pg.ckpt.<job>.recorded`` event): the step
    every rank acked durable and the COMMIT the acks named. A restore never picks an older step
    (a rollback: someone removed or hid the newer ones) unless the operator named that step
    (``allow_rollback``, ``POWERGUARD_ALLOW_ROLLBACK``)."""

    step: int
    commit: str | None = None  # :func:`_layout.commit_id` of the acked COMMIT
    saga_id: str | None = None
    allow_rollback: int | None = None

    def refusal(self, step: int) -> str | None:
        """Why ``step`` must not be restored (None: it may)."""
        if step >= self.step or step == self.allow_rollback:
            return None
        saga = f" (saga {self.saga_id})" if self.saga_id else ""
        return (
            f"step {step} is older than step {self.step}, which the coordinator recorded as acked by every rank"
            f"{saga}: a rollback; to restore it, name it: allow_rollback={step} (POWERGUARD_ALLOW_ROLLBACK={step})"
        )

    def named(self, step: int) -> str | None:
        """The COMMIT the acks named for ``step`` (None: not recorded)."""
        return self.commit if step == self.step else None


class NodeRestore(Protocol):
    def restore(self, newer_than: int | None = None, floor: Floor | None = None) -> tuple[Restored | None, list[str]]:
        """What it restored, or None and the committed checkpoints it refused ("dir: why")."""
        ...


def check_world(commit: dict, *, world_size: int, reshard: bool, rank: int) -> None:
    """A checkpoint of another world size is refused, unless ``reshard`` and it had more ranks."""
    written = commit.get("world_size")
    if written == world_size:
        return
    if reshard and isinstance(written, int) and written > world_size:
        log.warning(
            "rank %d: checkpoint written by %d ranks, resharded to %d (not a bit-exact resume: %s)",
            rank,
            written,
            world_size,
            "model and optimizer are resharded by DCP; rank r keeps old rank r's RNG and rank state; "
            "the data order changes with the world size",
        )
        return
    hint = (
        "; reshard=True resumes on fewer ranks (not bit-exact)"
        if isinstance(written, int) and written > world_size
        else ""
    )
    raise CorruptCheckpoint(f"written by {written} ranks, this job has {world_size}{hint}")


def load(state: TrainingState, reader: Any, ranks: Ranks) -> tuple[int, float]:
    """DCP-load a verified checkpoint into the training's objects: (its step, seconds)."""
    sd = state.state_dict(0)
    t0 = time.perf_counter()
    dcp.load(sd, storage_reader=reader, planner=SafeLoadPlanner(), process_group=ranks.save_group)
    return state.apply(sd), time.perf_counter() - t0


def _committed(fs: Any, directory: str) -> bool:
    try:
        return bool(fs.exists(f"{directory}/{L.COMMIT}"))
    except OSError:
        return False


def commit_saga(fs: Any, path: str, rank: int) -> str | None:
    """The saga a committed checkpoint answered (rank 0 reads it; a vanished file loses only that)."""
    if rank != 0:
        return None
    try:
        return L.read_commit(fs, path).get("saga_id")
    except CheckpointError:
        return None


class Restorer:
    def __init__(
        self,
        ranks: Ranks,
        state: TrainingState,
        *,
        job: str,
        root: str,
        fs: Any,
        remote_url: str | None,
        keys: K.Keys | None,
        reshard: bool,
        nodes: NodeRestore | None = None,
        allow_fresh_start: bool = False,
        readers: int = 1,
        s3: Any = None,
        node: str | None = None,
    ) -> None:
        self.s3, self.node = s3, node  # the S3 tier (_s3.S3Store): a step is staged on each node, then verified
        self.ranks, self.state, self.job, self.root, self.fs = ranks, state, job, root, fs
        self.readers = readers  # files each rank verifies at once
        self.remote_url, self.keys, self.reshard, self.nodes = remote_url, keys, reshard, nodes
        self.allow_fresh_start = allow_fresh_start
        self.refused: list[str] = []  # the last restore's committed checkpoints it could not restore
        self.own_step: int | None = None  # the last restore's: the job's own checkpoint's step
        self.floor: Floor | None = None  # the last restore's: what the coordinator recorded

    def restore(self, *, own_step: int | None = None, floor: Floor | None = None) -> Restored | None:
        """Every rank: the newest valid checkpoint, loaded; None when there is none. Every
        skipped checkpoint is logged with its reason. One span (``restore <job>``). ``own_step``:
        the job restored a checkpoint of its own at this step: only a newer one is loaded.
        ``floor``: what the coordinator recorded (no step older than it, unless named)."""
        self.own_step, self.floor = own_step, floor
        span = _spans.start(
            f"restore {self.job}",
            _spans.job_parent(),
            **{"powerguard.job": self.job, "powerguard.rank": self.ranks.rank},
        )
        try:
            got = self._restore()
            span.set_attribute("powerguard.step", got.step if got else -1)
            if self.ranks.rank == 0:  # one line at every start, shown by default (a warning: stderr)
                log.warning("%s", self.said(got))
                if got is not None and got.saga_id and floor is None:
                    log.warning(
                        "powerguard: job %s restored a power checkpoint (saga %s) but read no restore floor from "
                        "the coordinator's store: a rolled-back checkpoint cannot be told from the newest here",
                        self.job,
                        got.saga_id,
                    )
            return got
        except BaseException as exc:
            _spans.failed(span, exc)
            raise
        finally:
            span.end()

    def said(self, got: Restored | None) -> str:
        """The line every start prints: where the job resumed, or that it starts fresh and why."""
        if got is not None:
            saga = f", saga {got.saga_id}" if got.saga_id else ""
            return (
                f"powerguard: job {self.job} resumed at step {got.step + 1} from the {got.tier} tier's checkpoint "
                f"of step {got.step}{saga}"
            )
        if self.own_step is not None:
            return (
                f"powerguard: job {self.job} resumed at step {self.own_step + 1} from its own checkpoint of step "
                f"{self.own_step}: no PowerGuard checkpoint is newer"
            )
        if self.refused:
            return (
                f"powerguard: job {self.job}: fresh start at step 0 (allow_fresh_start) over "
                f"{len(self.refused)} committed checkpoint(s) that cannot be restored; the newest: {self.refused[0]}"
            )
        where = [f"{self.root}/{self.job}", *([f"{self.remote_url}/{self.job}"] if self.remote_url else [])]
        return f"powerguard: job {self.job}: fresh start at step 0: no checkpoint in {' or '.join(where)}"

    def _restore(self) -> Restored | None:
        rank = self.ranks.rank
        candidates = self.ranks.gather(self._candidates() if rank == 0 else None)[0]
        if self.own_step is not None:  # the job's own checkpoint stands unless one of these is newer
            candidates = [c for c in candidates if c[2] > self.own_step]
        refused: list[str] = []  # committed checkpoints that could not be restored, newest first
        floor = self.floor
        if self.nodes is not None:  # every node's own disk (and its peers') first, then the remote tier
            got, refused = self.nodes.restore(newer_than=self.own_step, floor=floor)
            if got is not None:
                return got
            candidates = [c for c in candidates if c[0] == "remote"]
        for tier, url, step, committed in candidates:
            if committed and floor is not None and (why := floor.refusal(step)):
                log.warning("rank %d: skipping %s checkpoint %s: %s", rank, tier, url, why)
                refused.append(f"{url}: {why}")
                continue
            if tier == "remote" and self.s3 is not None:
                url, staging_problem = self._staged(step)
                if staging_problem:
                    log.warning("rank %d: skipping remote checkpoint of step %d: %s", rank, step, staging_problem)
                    if committed:
                        refused.append(f"{self.s3.where(self.job, step)}: {staging_problem}")
                    continue
            fs, path = L.fs_for(url)
            # verified while loaded (each file hashed in the one pass that loads it), unless a fresh
            # start is allowed: a file failing half-way leaves the model part loaded, which only a
            # load of another checkpoint (every tensor again) or stopping may follow
            pipelined = L.is_local(fs) and not self.allow_fresh_start
            reason, files, key = self._verify(fs, path, tier, step, contents=not pipelined)
            loaded = None
            if not reason and pipelined:
                try:
                    reader = VerifyingReader(path, files=files, key=key, threads=self.readers)
                    loaded, seconds = load(self.state, reader, self.ranks)
                except CheckpointException as exc:
                    reason = corrupt_reason(exc)
                    if reason is None:
                        raise
            elif not reason:
                reader = SafeFileSystemReader(path, threads=self.readers) if L.is_local(fs) else SafeFsspecReader(url)
                loaded, seconds = load(self.state, reader, self.ranks)
            if reason or loaded is None:
                log.warning("rank %d: skipping %s checkpoint %s: %s", rank, tier, url, reason)
                if committed:
                    refused.append(f"{url}: {reason}")
                continue
            log.info("rank %d: restored step %d from the %s tier (%s)", rank, loaded, tier, url)
            if self.keys is None and rank == 0:
                log.info(
                    "rank 0: no checkpoint key (POWERGUARD_CKPT_KEY_FILE): the checksums found no corruption, but "
                    "whoever can write the tier could have rewritten them (forgery is not detected); nothing "
                    "read ran code (.metadata and state read without unpickling arbitrary objects)"
                )
            return Restored(loaded, tier, commit_saga(fs, path, rank), seconds)
        self.refused = refused
        if refused and not self.allow_fresh_start:
            raise NoRestorableCheckpoint(
                f"rank {rank}: job {self.job} has {len(refused)} committed checkpoint(s) and none can be "
                f"restored; the newest: {refused[0]}. Training from step 0 would lose them: fix the cause "
                "(reshard=True resumes one written by more ranks), or pass allow_fresh_start=True"
            )
        if floor is not None and not self.allow_fresh_start and self.own_step is None:
            saga = f" (saga {floor.saga_id})" if floor.saga_id else ""
            raise NoRestorableCheckpoint(
                f"rank {rank}: job {self.job}: the coordinator recorded step {floor.step} as acked by every rank"
                f"{saga}, and no checkpoint of it or a later step is here: training from step 0 would lose it "
                "(restore the tier, or pass allow_fresh_start=True)"
            )
        log.info("rank %d: no valid checkpoint for job %s; starting from step 0", rank, self.job)
        return None

    def _candidates(self) -> list[tuple[str, str, int, bool]]:
        """(tier, url, step, committed: it has a COMMIT) of every step directory, newest first per tier."""
        out = [("local", d, s, _committed(self.fs, d)) for s, d in L.list_steps(self.fs, self.root, self.job)]
        if self.s3 is not None:
            out += [("remote", self.s3.where(self.job, s), s, c) for s, c in self.s3.steps(self.job).items()]
        elif self.remote_url:
            rfs, rpath = L.fs_for(self.remote_url)
            proto = rfs.protocol if isinstance(rfs.protocol, str) else rfs.protocol[0]
            for s, d in L.list_steps(rfs, rpath, self.job):
                out.append(("remote", d if "://" in d else f"{proto}://{d}", s, _committed(rfs, d)))
        return out

    def _staged(self, step: int) -> tuple[str, str | None]:
        """The S3 tier's step downloaded into this node's staging directory (by the node's first
        rank, its objects in parallel, S3 checking each one's checksum), to be verified and loaded
        as any local copy: (the directory, why not or None), the same on every rank."""
        dst = os.path.join(self.root, ".remote", self.job, f"step-{step}")
        nodes = self.ranks.gather(self.node)
        problem = None
        if nodes.index(self.node) == self.ranks.rank:
            t0 = time.perf_counter()
            try:
                got = self.s3.download(self.job, step, dst)
                log.info(
                    "rank %d: step %d read from %s (%.1f MB in %.2fs)",
                    self.ranks.rank,
                    step,
                    self.s3.where(self.job, step),
                    got / 1e6,
                    time.perf_counter() - t0,
                )
            except Exception as exc:  # botocore's errors, a checksum S3 refused, the disk
                problem = f"rank {self.ranks.rank}: reading {self.s3.where(self.job, step)}: {exc}"
        problems = [p for p in self.ranks.gather(problem) if p]
        return dst, ("; ".join(problems) or None)

    def _verify(
        self, fs, path: str, tier: str, step: int, *, contents: bool
    ) -> tuple[str | None, dict[str, dict[str, Any]], bytes | None]:
        """Every rank checks a share of the files; all agree. Returns (the reason it is bad or
        None, the files the manifests list, the key that signed it). With a key, COMMIT's
        signature is checked first: an unsigned checkpoint is not read; with or without one, a
        COMMIT of another job, step or tier is refused by name (:func:`_layout.check_binding`), and
        the step the coordinator recorded must be the COMMIT its acks named. Without ``contents``
        the files are checked by size here and in full as they are loaded (:class:`VerifyingReader`)."""
        rank, world = self.ranks.rank, self.ranks.world_size
        reason, files, key = None, {}, None
        try:
            commit = L.read_commit(fs, path)
            # a plain copy from another job, step or tier is named as such (then the key decides)
            L.check_binding(commit, job=self.job, step=step, tier=tier, where=path)
            key = self.keys.for_commit(commit, path) if self.keys is not None else None
            L.authenticate(commit, key, path)
            named = self.floor.named(step) if self.floor is not None else None
            if named is not None and L.commit_id(commit) != named:
                raise CorruptCheckpoint(f"{path}: not the checkpoint of step {step} the job's acks named")
            check_world(commit, world_size=world, reshard=self.reshard, rank=rank)
            files = L.manifest_files(fs, path, commit, key)
            names = sorted(files)[rank::world]
            if contents:
                L.verify_files(fs, path, files, names, key, threads=self.readers)
            else:
                precheck_sizes(path, {n: files[n] for n in names})
            if rank == 0:
                L.verify_metadata(fs, path, commit, key)
                check_metadata(fs, path)  # without a key a forger recomputes the checksum
        except (CorruptCheckpoint, OSError, KeyError, ValueError) as exc:
            reason = str(exc)
        reasons = [r for r in self.ranks.gather(reason) if r]
        return ("; ".join(reasons) if reasons else None), files, key


def corrupt_reason(exc: CheckpointException) -> str | None:
    """What DCP's load failure says was wrong with the checkpoint's files (every rank's
    :class:`CorruptCheckpoint`), or None when no rank found its files bad (another failure)."""
    found = []
    for failure in exc.failures.values():
        cause = failure[0] if isinstance(failure, tuple) else failure
        if isinstance(cause, CorruptCheckpoint):
            found.append(str(cause))
    return "; ".join(found) if found else None


def resumed(
    *, job: str, step: int, restored: Restored | None, restore_ended: float | None, source: str
) -> tuple[JobResumed, Any]:
    """The ``job.resumed`` announcement (rank 0, after the first step following a restore) and
    the context of its span (restore finished -> first training step done)."""
    span = _spans.start(
        f"resume {job}",
        _spans.job_parent(),
        restore_ended,
        **{
            "powerguard.job": job,
            "powerguard.step": step,
            "powerguard.restored_step": restored.step if restored else None,
        },
    )
    span.end()
    event = JobResumed(
        source=source,
        data=JobData(
            job=job,
            # the saga that restarted this process (power-control's environment), else the
            # saga whose checkpoint was restored; the coordinator matches the resume to it
            saga_id=os.environ.get("POWERGUARD_SAGA") or (restored.saga_id if restored else None),
            rank=0,
            step=restored.step if restored else None,
            detail=f"restored from the {restored.tier} tier" if restored else "no checkpoint: started from step 0",
        ),
    )
    return event, _spans.inside(span)


def framework_restored(directory: str | os.PathLike | None, step: int, rank: int) -> Restored | None:
    """What a framework resumed from (its own checkpoint directory; None: it started afresh)."""
    if directory is None:
        return None
    fs, _ = L.fs_for(os.fspath(directory))
    return Restored(step, "local", commit_saga(fs, os.fspath(directory), rank), 0.0)
