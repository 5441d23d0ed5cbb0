"""Remote tier: rank 0 copies committed local checkpoints in a background thread
(periodically, and on request when the deadline leaves time) to an fsspec URL or to S3
(``_s3.py``: S3's own guarantees, not a file system's). Data files first, then the manifests,
then the remote ``COMMIT`` (naming the remote tier, signed again with the job's key): a copy
cut short is never trusted. On a file system of this host's (``file://``: a disk, an NFS
mount) every file and every directory the copy makes is fsynced before the ``COMMIT`` is
written: a copy reported committed (an ack raised to ``remote``) survives a power cut of the
host that holds it (tests/powercut, ``remote=True``); on S3 a COMMIT is stored (200) only after
every object it names was stored and read back."""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
from collections.abc import Callable

from . import _layout as L
from ._s3 import CommitConflict, S3Store
from .errors import CorruptCheckpoint, NotAllHere

RETRY_S = (2.0, 5.0, 10.0, 20.0)  # a failed copy is tried again this long after each failure
REPLICATION_WAIT_S = 120.0  # the node-local tier: how long a copy waits for the files to reach rank 0's node
log = logging.getLogger("powerguard.ckpt_agent.remote")


class RemoteCopier:
    def __init__(
        self,
        local_root: str,
        remote_url: str,
        *,
        job: str,
        keep: int,
        every_s: float,
        key: bytes | None = None,
        on_copied: Callable[[int, str], None] | None = None,
        s3: S3Store | None = None,
        replicated: Callable[[float], bool] | None = None,
    ) -> None:
        self.local_root, self.remote_url, self.job = local_root, remote_url, job
        # the node-local tier: waits (up to the seconds given) until the last checkpoint's files
        # reached this node (its replication and gathering ended); True once they did
        self.replicated = replicated
        self.key = key  # signs the remote copy's COMMIT (it names the remote tier)
        self.keep, self.every_s = keep, every_s
        self.s3 = s3
        self.copied: set[int] = set()
        if s3 is None:
            self.fs, self.root = L.fs_for(remote_url)
            self.copied = {s for s, d in L.list_steps(self.fs, self.root, job) if self.fs.exists(f"{d}/{L.COMMIT}")}
        self.throughput = 100e6  # bytes/s, updated after every copy
        self.last_copy = time.monotonic()
        self.errors: list[str] = []
        self._queue: queue.Queue[int | None] = queue.Queue()
        self._closing = threading.Event()
        self._queued: set[int] = set()
        self.on_copied = on_copied  # after a copy is committed remotely (on the copier's thread)
        self._thread = threading.Thread(target=self._run, name="pg-ckpt-remote", daemon=True)
        self._thread.start()

    def maybe_copy(self, step: int | None) -> None:
        if step is None or self.every_s <= 0 or time.monotonic() - self.last_copy < self.every_s:
            return
        self._enqueue(step)

    def copy_if_time_allows(self, step: int, deadline_ts: float | None) -> bool:
        size = _dir_size(L.step_dir(self.local_root, self.job, step))
        needed = size / self.throughput
        if deadline_ts is not None and time.time() + needed > deadline_ts:
            log.info(
                "remote copy of step %d skipped: needs ~%.0fs, deadline in %.0fs",
                step,
                needed,
                deadline_ts - time.time(),
            )
            return False
        self._enqueue(step)
        return True

    def _enqueue(self, step: int) -> None:
        if step in self.copied or step in self._queued:
            return
        self._queued.add(step)
        self.last_copy = time.monotonic()
        self._queue.put(step)

    def close(self) -> None:
        self._closing.set()
        self._queue.put(None)
        self._thread.join(30)

    def _run(self) -> None:
        if self.s3 is not None:  # what a cut left: uncommitted uploads aborted, the committed steps known
            try:
                self.s3.abort_incomplete(self.job)
                self.copied |= {s for s, c in self.s3.steps(self.job).items() if c}
            except Exception as exc:
                log.error("remote tier %s not read at start: %s", self.remote_url, exc)
                self.errors.append(f"start: {exc}")
        while (step := self._queue.get()) is not None:
            try:
                if self.replicated is not None and not self.replicated(REPLICATION_WAIT_S):
                    log.warning(
                        "remote copy of step %d: the node tier's replication still runs after %.0fs",
                        step,
                        REPLICATION_WAIT_S,
                    )
                url = self._copy_retried(step)
                if self.on_copied is not None:
                    self.on_copied(step, url)
            except Exception as exc:
                log.error("remote copy of step %d failed: %s", step, exc)
                self.errors.append(f"step {step}: {exc}")
            finally:
                self._queued.discard(step)

    def _copy_retried(self, step: int) -> str:
        """A copy that failed (the store unreachable, restarting) is tried again, from the start
        (what a failed try stored is uncommitted: never read), ``RETRY_S`` apart; a refusal that
        another try cannot change (another writer's COMMIT, a file that does not match its
        manifest) is not."""
        for delay in (*RETRY_S, None):
            try:
                return self.copy(step)
            except (CommitConflict, CorruptCheckpoint, FileNotFoundError):
                raise
            except Exception as exc:
                if delay is None or self._closing.is_set():
                    raise
                log.warning("remote copy of step %d failed (%s): trying again in %.0fs", step, exc, delay)
                self._closing.wait(delay)
        raise AssertionError("unreachable")

    def copy(self, step: int) -> str:
        src = L.step_dir(self.local_root, self.job, step)
        if not os.path.exists(os.path.join(src, L.COMMIT)):
            raise FileNotFoundError(f"{src} is not committed")
        if self.s3 is not None:
            return self._copy_s3(src, step)
        with open(os.path.join(src, L.COMMIT), "rb") as f:
            committed = json.loads(f.read())
        names = sorted(L.checkpoint_files(L.fs_for(src)[0], src, committed))  # not a replica still arriving
        manifests = {L.manifest_name(int(r)) for r in committed["manifests"]}
        if missing := [n for n in names if not os.path.exists(os.path.join(src, n))]:
            raise NotAllHere(
                f"step {step}: {len(missing)} of the checkpoint's {len(names)} files are not in {src} "
                f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}): on the node-local tier a "
                "sharded job's node holds its own shards and the replicas received so far; the copy is "
                "made once every file is here, never without one"
            )
        dst = L.step_dir(self.root, self.job, step)
        t0 = time.perf_counter()
        local = L.is_local(self.fs)  # a file system of this host's (a disk, an NFS mount): fsync it
        if self.fs.exists(dst):
            self.fs.rm(dst, recursive=True)
        if local:  # every directory made is fsynced into its parent: else the copy's name is lost
            L.makedirs_durable(dst)
        else:
            self.fs.makedirs(dst, exist_ok=True)
        size = 0
        for n in [n for n in names if n not in manifests] + [n for n in names if n in manifests]:
            self.fs.put_file(os.path.join(src, n), f"{dst}/{n}")
            if local:  # before the COMMIT: a copy whose data is not on disk is never committed
                _fsync_file(f"{dst}/{n}")
            size += os.path.getsize(os.path.join(src, n))
        if local:
            L.fsync_dir(dst)  # every data file's name, before the COMMIT names them complete
        commit = L.rebound(committed, tier="remote", key=self.key)
        L.write_durable(self.fs, f"{dst}/{L.COMMIT}", commit)
        elapsed = time.perf_counter() - t0
        self.throughput = max(1e6, size / max(elapsed, 1e-6))
        self.copied.add(step)
        removed = L.retain(self.fs, self.root, self.job, self.keep)
        if local and removed:
            L.fsync_dir(os.path.dirname(dst))
        log.info("step %d copied to %s (%.1f MB in %.2fs)", step, self.remote_url, size / 1e6, elapsed)
        return dst

    def _copy_s3(self, src: str, step: int) -> str:
        """Every object with its checksum, read back against the manifests, then COMMIT created
        (``If-None-Match: *``): the copy counts (the acks say ``remote``) only once S3 stored it."""
        assert self.s3 is not None
        t0 = time.perf_counter()
        with open(os.path.join(src, L.COMMIT), "rb") as f:
            commit = L.rebound(json.loads(f.read()), tier="remote", key=self.key)
        size = self.s3.upload(src, self.job, step, commit)
        elapsed = time.perf_counter() - t0
        if size:
            self.throughput = max(1e6, size / max(elapsed, 1e-6))
        self.copied.add(step)
        self.s3.retain(self.job, self.keep)
        where = self.s3.where(self.job, step)
        log.info("step %d copied to %s (%.1f MB in %.2fs)", step, where, size / 1e6, elapsed)
        return where


def _fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _dir_size(path: str) -> int:
    try:
        return sum(e.stat().st_size for e in os.scandir(path) if e.is_file())
    except FileNotFoundError:
        return 0
