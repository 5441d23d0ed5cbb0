"""Restore: the newest committed checkpoint that verifies (local tier, then remote), loaded
bit-exact, and the ``job.resumed`` announcement naming the saga it ends."""

from __future__ import annotations

import logging
import os
import time

import torch.distributed.checkpoint as dcp

from powerguard.schemas import JobData, JobResumed

from . import _layout as L
from . import _spans
from ._metadata import SafeFileSystemReader, SafeFsspecReader, check_metadata
from .errors import CheckpointError, CorruptCheckpoint

log = logging.getLogger("powerguard.ckpt_agent")


class _RestoreMixin:
    """Restore and verify of :class:`CheckpointAgent` (mixed in)."""

    def restore(self) -> int:
        """Load the newest valid committed checkpoint (local tier, then remote); return the step
        to run next (0 when there is none). Every skipped checkpoint is logged with its reason."""
        span = _spans.start(
            f"restore {self.job}", _spans.job_parent(), **{"powerguard.job": self.job, "powerguard.rank": self.rank}
        )
        try:
            step = self._restore()
            span.set_attribute("powerguard.step", step - 1 if step else -1)
            return step
        except BaseException as exc:
            _spans.failed(span, exc)
            raise
        finally:
            span.end()
            self._restore_ended = time.time()

    def _restore(self) -> int:
        candidates = self._gather(self._candidates() if self.rank == 0 else None)[0]
        if self.local_scope == "node":  # every node's own disk (and its peers') first, then the remote tier
            got = self._restore_from_nodes()
            if got is not None:
                return got
            candidates = [c for c in candidates if c[0] == "remote"]
        for tier, url, _step in candidates:
            fs, path = L.fs_for(url)
            reason = self._verify(fs, path)
            if reason:
                log.warning("rank %d: skipping %s checkpoint %s: %s", self.rank, tier, url, reason)
                continue
            sd = self._state_dict()
            reader = SafeFileSystemReader(path) if L.is_local(fs) else SafeFsspecReader(url)
            t0 = time.perf_counter()
            dcp.load(sd, storage_reader=reader, process_group=self._save_group)
            loaded = self._apply_state(sd)
            self.stats["restore_s"] = time.perf_counter() - t0
            self.last_committed_step = loaded
            self._step = loaded
            log.info("rank %d: restored step %d from the %s tier (%s)", self.rank, loaded, tier, url)
            if self._key is None and self.rank == 0:
                log.info(
                    "rank 0: no site key (POWERGUARD_CKPT_KEY_FILE): the checksums found no corruption, but "
                    "whoever can write the tier could have rewritten them (forgery is not detected); nothing "
                    "read ran code (.metadata and state read without unpickling arbitrary objects)"
                )
            self._restored = (loaded, tier)
            if self.rank == 0:
                try:
                    self._restored_saga = L.read_commit(fs, path).get("saga_id")
                except CheckpointError:  # verified just above; a vanished file only loses the saga id
                    self._restored_saga = None
            return loaded + 1
        self._restored = None
        log.info("rank %d: no valid checkpoint for job %s; starting from step 0", self.rank, self.job)
        return 0

    def _candidates(self) -> list[tuple[str, str, int]]:
        out = [("local", d, s) for s, d in L.list_steps(self._local_fs, self.local_root, self.job)]
        if self.remote_url:
            rfs, rpath = L.fs_for(self.remote_url)
            proto = rfs.protocol if isinstance(rfs.protocol, str) else rfs.protocol[0]
            for s, d in L.list_steps(rfs, rpath, self.job):
                out.append(("remote", d if "://" in d else f"{proto}://{d}", s))
        return out

    def _verify(self, fs, path: str) -> str | None:
        """Every rank checks a share of the files; all agree. Returns the reason it is bad, or None.
        With a site key, COMMIT's signature is checked first: an unsigned checkpoint is not read."""
        reason = None
        try:
            commit = L.read_commit(fs, path)
            L.authenticate(commit, self._key, path)
            self._check_world(commit)
            files = L.manifest_files(fs, path, commit, self._key)
            names = sorted(files)[self.rank :: self.world_size]
            L.verify_files(fs, path, files, names, self._key)
            if self.rank == 0:
                L.verify_metadata(fs, path, commit, self._key)
                check_metadata(fs, path)  # without a site key a forger recomputes the checksum
        except (CorruptCheckpoint, OSError, KeyError, ValueError) as exc:
            reason = str(exc)
        reasons = [r for r in self._gather(reason) if r]
        return "; ".join(reasons) if reasons else None

    def _check_world(self, commit: dict) -> None:
        """A checkpoint of another world size is refused, unless ``reshard`` and it had more ranks."""
        written = commit.get("world_size")
        if written == self.world_size:
            return
        if self.reshard and isinstance(written, int) and written > self.world_size:
            log.warning(
                "rank %d: checkpoint written by %d ranks, resharded to %d (not a bit-exact resume: %s)",
                self.rank,
                written,
                self.world_size,
                "model and optimizer are resharded by DCP; rank r keeps old rank r's RNG and rank state; "
                "the data order changes with the world size",
            )
            return
        hint = (
            "; reshard=True resumes on fewer ranks (not bit-exact)"
            if isinstance(written, int) and written > self.world_size
            else ""
        )
        raise CorruptCheckpoint(f"written by {written} ranks, this job has {self.world_size}{hint}")

    def report_resumed(self) -> None:
        """Announce ``job.resumed`` once (rank 0), after the first step following a restore."""
        if self._resumed_reported or self._bus is None or self.rank != 0:
            return
        self._resumed_reported = True
        restored = self._restored
        span = _spans.start(
            f"resume {self.job}",
            _spans.job_parent(),
            getattr(self, "_restore_ended", None),
            **{
                "powerguard.job": self.job,
                "powerguard.step": self._step,
                "powerguard.restored_step": restored[0] if restored else None,
            },
        )
        span.end()  # restore finished -> first training step done
        self._bus.publish_nowait(
            JobResumed(
                source=self._bus.source,
                data=JobData(
                    job=self.job,
                    # the saga that restarted this process (power-control's environment), else the
                    # saga whose checkpoint was restored; the coordinator matches the resume to it
                    saga_id=os.environ.get("POWERGUARD_SAGA") or self._restored_saga,
                    rank=0,
                    step=restored[0] if restored else None,
                    detail=f"restored from the {restored[1]} tier"
                    if restored
                    else "no checkpoint: started from step 0",
                ),
            ),
            _spans.inside(span),
        )
