"""Saves of the local tier: a synchronous durable checkpoint (a power request, an explicit
``save``) and the periodic one (DCP's async save, staged while the next step trains, then
committed at a later agreement). Every rank writes its files and manifest into the step
directory; the tier (``_tiers``) commits. Returns :class:`Saved`; never writes the agent's
progress.
"""

from __future__ import annotations

import json
import logging
import os
import time
import weakref
from concurrent.futures import Future
from typing import Any

import torch.distributed.checkpoint as dcp

from . import _layout as L
from ._acks import Saved
from ._hashing import HashingWriter
from ._ranks import Ranks
from ._staging import ReusingStager, partition_replicated
from ._state import TrainingState
from ._tiers import Tier, Written
from ._writers import local_bytes, writer_threads
from .errors import CheckpointError, CommitError, CorruptCheckpoint

log = logging.getLogger("powerguard.ckpt_agent")


class Saver:
    def __init__(
        self,
        ranks: Ranks,
        state: TrainingState,
        tier: Tier,
        *,
        job: str,
        root: str,
        fs: Any,
        key: bytes | None,
        every_s: float,
        overlap: bool,
        node: str,
        writers: int | None = None,
        readers: int = 1,
    ) -> None:
        self.ranks, self.state, self.tier = ranks, state, tier
        self.writers = writers  # DCP's thread_count (None: by the state's size)
        self.readers = readers  # files a rank reads back at once (the restore's rule: _writers.reader_threads)
        self.job, self.root, self.fs, self.key, self.every_s, self.node = job, root, fs, key, every_s, node
        self.stats: dict[str, float] = {}
        self._last_local = time.monotonic()
        self._forced = False
        self._async: tuple[int, Future, HashingWriter, float] | None = None
        self._verified: dict[int, None] = {}  # steps this process committed or verified, oldest first
        # weak references only: a cycle through the stager or the optimizer would keep the saver and
        # the agent's gloo process groups alive until interpreter shutdown, where destroying them aborts
        stable = weakref.WeakMethod(state.stable_storages)
        self.stager = ReusingStager(stable=(lambda: ((m := stable()) and m()) or set()) if overlap else None)
        self._hook = None
        if overlap and state.optimizer is not None:
            before = weakref.WeakMethod(self._before_optimizer_step)
            self._hook = state.optimizer.register_step_pre_hook(lambda *a: (m := before()) and m(*a))

    # ------------------------------------------------------------------ what the agreement asks
    def periodic_due(self, now: float) -> bool:
        """Rank 0's clock says a periodic save is due (or :meth:`due_now` asked for one)."""
        if self.ranks.rank != 0:
            return False
        return self._forced or (self.every_s > 0 and now - self._last_local >= self.every_s)

    def due_now(self) -> None:
        """The next agreement says a periodic save is due (benchmarks time one on demand)."""
        self._forced = True

    @property
    def writing(self) -> bool:
        return self._async is not None and not self._async[1].done()

    @property
    def unfinished(self) -> bool:
        return self._async is not None

    # ------------------------------------------------------------------ synchronous
    def save(self, step: int, *, saga_id: str | None = None) -> Saved:
        """Every rank: a durable checkpoint of ``step`` (raises :class:`CheckpointError`). A step
        already committed is acked without a write only when every rank verified its own files
        against COMMIT again; otherwise it is set aside (renamed, logged) and written anew."""
        t0 = time.perf_counter()
        directory = L.step_dir(self.root, self.job, step)
        committed = self._prepare(directory)
        if committed:
            # a step this process committed or verified is not read again (a paused job's hold
            # checkpoints repeat one step); one found on disk (an earlier run's) is
            problem = None if step in self._verified else self._verify_own(directory)
            problems = [p for p in self.ranks.gather(problem) if p]
            if not problems:  # this exact step is already durable (e.g. a periodic save of the same step)
                self._trust(step)
                return self._existing(directory, step, time.perf_counter() - t0)
            self._set_aside(directory, "; ".join(problems))
            if self._prepare(directory):
                raise CommitError(f"checkpoint {directory}: still committed after it was set aside")
        state = self.state.state_dict(step)
        threads = self.writers or writer_threads(local_bytes(state))
        writer = HashingWriter(directory, sync_files=True, key=self.key, thread_count=threads)
        try:
            dcp.save(state, storage_writer=writer, process_group=self.ranks.save_group)
            ok, err = True, None
        except BaseException as exc:  # CheckpointException derives from BaseException
            if isinstance(exc, KeyboardInterrupt | SystemExit):
                raise
            ok, err = False, exc
        return self._commit(directory, step, writer, ok, err, t0, time.perf_counter(), saga_id)

    def _prepare(self, directory: str) -> bool:
        """Every rank: the step's directory made (an uncommitted leftover removed first) by the
        tier's leaders; whether every leader found it committed already."""
        self.tier.ready()  # e.g. a shared tier proven shared (collective)
        committed, problem = False, None
        if self.tier.leader:
            try:
                if os.path.isdir(directory) and not os.path.exists(os.path.join(directory, L.COMMIT)):
                    log.warning("removing uncommitted leftover %s", directory)
                    self.fs.rm(directory, recursive=True)
                L.makedirs_durable(directory)
                committed = os.path.exists(os.path.join(directory, L.COMMIT))
            except OSError as exc:  # every rank must hear it: the others would wait in DCP's collectives
                problem = f"rank {self.ranks.rank} (node {self.node}): cannot prepare {directory}: {exc}"
        else:
            committed = True  # only the leaders' answers count
        problem = problem or self.tier.check()  # e.g. a shared tier this rank no longer sees
        answers = self.ranks.gather((committed, problem))
        if problem := "; ".join(p for _, p in answers if p):
            raise CommitError(problem)
        return all(c for c, _ in answers)

    def _trust(self, step: int) -> None:
        """``step`` was committed or verified by this process (the newest few are kept)."""
        self._verified[step] = None
        while len(self._verified) > 16:
            del self._verified[next(iter(self._verified))]

    def _verify_own(self, directory: str) -> str | None:
        """This rank's files of a committed step read back against its manifest and COMMIT (and
        DCP's .metadata on rank 0): what is wrong, or None."""
        rank = self.ranks.rank
        try:
            commit = L.read_commit(self.fs, directory)
            with open(os.path.join(directory, L.manifest_name(rank)), "rb") as f:
                body = f.read()
            if commit["manifests"].get(str(rank)) != L.digest_bytes(body):
                raise CorruptCheckpoint(f"{directory}: manifest of rank {rank} does not match COMMIT")
            files = json.loads(body)["files"]
            L.verify_files(self.fs, directory, files, sorted(files), self.key, threads=self.readers)
            if rank == 0:
                L.verify_metadata(self.fs, directory, commit, self.key)
        except (CheckpointError, OSError, KeyError, ValueError) as exc:
            return f"rank {rank} (node {self.node}): {exc}"
        return None

    def _set_aside(self, directory: str, why: str) -> None:
        """Every rank: a committed step that failed its check renamed out of the restore's sight
        by the tier's leaders (kept for a post-mortem, never deleted here)."""
        aside = f"{directory}.refused-{time.strftime('%Y%m%dT%H%M%S')}"
        problem = None
        if self.tier.leader:
            try:
                os.rename(directory, aside)
                L.fsync_dir(os.path.dirname(directory))
                log.warning(
                    "rank %d: committed %s failed its check (%s): set aside as %s, written anew",
                    self.ranks.rank,
                    directory,
                    why,
                    aside,
                )
            except OSError as exc:
                problem = f"rank {self.ranks.rank} (node {self.node}): cannot set aside {directory}: {exc}"
        if problem := "; ".join(p for p in self.ranks.gather(problem) if p):
            raise CommitError(problem)

    def _commit(
        self,
        directory: str,
        step: int,
        writer: HashingWriter,
        ok: bool,
        err: BaseException | None,
        t0: float,
        t_write: float,
        saga_id: str | None = None,
    ) -> Saved:
        rank = self.ranks.rank
        digest, nbytes, keyed = "", 0, None
        if ok:
            try:
                digest, nbytes, keyed = L.write_manifest(
                    self.fs, directory, rank, step, writer.data_files(), key=self.key
                )
            except OSError as exc:
                ok, err = False, exc
        body = meta = None
        if ok and self.tier.bodies:  # every node stores every manifest and the metadata
            try:
                with open(os.path.join(directory, L.manifest_name(rank)), "rb") as f:
                    body = f.read()
                if rank == 0:
                    with open(os.path.join(directory, ".metadata"), "rb") as f:
                        meta = f.read()
            except OSError as exc:
                ok, err = False, exc
        written = [
            Written(*w) for w in self.ranks.gather((rank, ok, digest, repr(err) if err else None, keyed, body, meta))
        ]
        failures = [f"rank {w.rank}: {w.error}" for w in written if not w.ok]
        if failures:
            raise CommitError(f"checkpoint {directory} not committed: {'; '.join(failures)}")
        durability = self.tier.commit(directory, step, written, saga_id=saga_id)
        self._trust(step)
        t_end = time.perf_counter()
        self._last_local = time.monotonic()
        log.info("rank %d: step %d durable in %s (%.1f MB, %.2fs)", rank, step, directory, nbytes / 1e6, t_end - t0)
        contents = L.contents_id(self.job, step, self.ranks.world_size, {str(w.rank): w.digest for w in written})
        return Saved(
            directory,
            nbytes,
            digest,
            t_write - t0,
            t_end - t_write,
            t_end - t0,
            durability=durability,
            commit=contents,
        )

    def _existing(self, directory: str, step: int, elapsed: float) -> Saved:
        with open(os.path.join(directory, L.manifest_name(self.ranks.rank)), "rb") as f:
            body = f.read()
        files = json.loads(body)["files"]
        try:
            contents = L.commit_id(L.read_commit(self.fs, directory))
        except CheckpointError:
            contents = None
        nbytes = sum(f["size"] for f in files.values())
        return Saved(directory, nbytes, L.digest_bytes(body), 0.0, elapsed, elapsed, commit=contents)

    # ------------------------------------------------------------------ periodic (async)
    def _before_optimizer_step(self, *_: Any) -> None:
        """The optimizer is about to change what a background copy may still be reading."""
        staging = self.stager.staging
        if staging is not None and not staging.done():
            t0 = time.perf_counter()
            self.stager.wait_staged()
            self.stats["async_wait_s"] = self.stats.get("async_wait_s", 0.0) + time.perf_counter() - t0

    def start(self, step: int) -> None:
        """Every rank: start the periodic save of ``step`` (staged now, written in the background)."""
        self._forced = False
        directory = L.step_dir(self.root, self.job, step)
        if self.ranks.rank == 0:
            L.makedirs_durable(directory)
        self.ranks.gather(None)  # the directory exists before anyone writes
        writer = HashingWriter(directory, sync_files=True, key=self.key)
        t0 = time.perf_counter()
        self.stats["async_wait_s"] = 0.0
        future = dcp.async_save(
            partition_replicated(self.state.state_dict(step), rank=self.ranks.rank, world_size=self.ranks.world_size),
            storage_writer=writer,
            process_group=self.ranks.save_group,
            async_stager=self.stager,
        )
        future = getattr(future, "upload_completion", future)  # a staging Future gives an AsyncSaveResponse
        self.stats["async_stall_s"] = time.perf_counter() - t0
        self._async = (step, future, writer, t0)

    def finish(self) -> tuple[int, Saved] | None:
        """Every rank: commit the periodic save in flight, once its writing ended; (its step,
        what was saved), or None when there was none or it failed (logged)."""
        if self._async is None:
            return None
        step, future, writer, t0 = self._async
        self._async = None
        try:
            future.result()
            ok, err = True, None
        except BaseException as exc:
            ok, err = False, exc
        directory = L.step_dir(self.root, self.job, step)
        try:
            info = self._commit(directory, step, writer, ok, err, t0, time.perf_counter())
        except CheckpointError as exc:
            log.error("periodic checkpoint of step %d failed: %s", step, exc)
            self._last_local = time.monotonic()
            return None
        self.stats["async_total_s"] = info.total_s
        return step, info

    def close(self) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        self.stager.close()
