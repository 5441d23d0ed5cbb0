"""Answers to checkpoint requests: ``ckpt.durable`` and ``ckpt.failed`` for every request a
checkpoint served, with the request and saga they answer and the rank that answers."""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import dataclass
from typing import Any

from powerguard.schemas import (
    MAX_RANK_SPANS,
    CheckpointDurable,
    CheckpointDurableData,
    CheckpointFailed,
    CheckpointFailedData,
    CheckpointRequestData,
    Durations,
)

from . import _layout as L
from .errors import CheckpointError

log = logging.getLogger("powerguard.ckpt_agent")


@dataclass
class Saved:
    """A durable checkpoint this rank took part in (what ``CheckpointAgent.save`` returns)."""

    path: str  # the step directory
    bytes: int  # bytes this rank wrote
    digest: str  # xxh3-128 of this rank's manifest
    write_s: float
    commit_s: float
    total_s: float
    agree_s: float = 0.0  # waiting for every rank to agree on the step (power-event saves)
    durability: str = "local"  # local | replicated:k (node scope: every file on k+1 nodes' disks)
    commit: str | None = None  # the committed contents' id (_layout.commit_id): the acks name it

    def durations(self) -> Durations:
        return Durations(agree_s=self.agree_s, write_s=self.write_s, commit_s=self.commit_s, total_s=self.total_s)


class Acks:
    """This rank's answers on the bus (none without a bus): ``durable`` and ``failed`` for the
    requests a checkpoint served, and, rank 0, the second ack of each once the remote copier
    put the checkpoint on the remote tier (it calls :meth:`remote_copied` on its thread)."""

    def __init__(self, bus: Any, *, job: str, rank: int, world_size: int, local_root: str, fs: Any) -> None:
        self.bus, self.job, self.rank, self.world_size = bus, job, rank, world_size
        self.local_root, self.fs = local_root, fs
        self._remote_waiting: dict[int, list[CheckpointRequestData]] = {}  # step -> requests to ack "remote"
        self._replica_waiting: dict[int, list[CheckpointRequestData]] = {}  # step -> requests to raise
        self._replicated: dict[int, tuple[list[tuple[int, str, int]], str, str]] = {}  # copies landed first
        self._lock = threading.Lock()  # the copier's and replicator's threads pop what the training thread put

    def _fields(self, r: CheckpointRequestData) -> dict[str, Any]:
        """What every ack of this rank to request ``r`` carries."""
        return {
            "request_id": r.request_id,
            "saga_id": r.saga_id,
            "job": self.job,
            "rank": self.rank,
            "world_size": self.world_size,
        }

    def durable(self, requests: list[CheckpointRequestData], step: int, info: Saved, ctx: Any = None) -> None:
        """Every rank answers ``requests``: for itself, or, where a request asked for one ack per
        job, rank 0 for every rank (the COMMIT it wrote names them all) and the others not at all."""
        if self.bus is None or not requests:
            return

        def event_for(r: CheckpointRequestData) -> CheckpointDurable | None:
            spans = None
            if r.acks == "job":
                if self.rank != 0:
                    return None
                spans = [(0, self.world_size - 1)]
            data = CheckpointDurableData(
                **self._fields(r),
                step=step,
                tier="local",
                path=info.path,
                bytes=info.bytes,
                digest=info.digest,
                commit=info.commit,
                durations=info.durations(),
                durability=info.durability,
                ranks=spans,
            )
            return CheckpointDurable(source=self.bus.source, data=data)

        self.bus.answer(requests, event_for, ctx)

    def failed(self, requests: list[CheckpointRequestData], exc: BaseException, *, step: int, ctx: Any = None) -> None:
        log.error("rank %d: checkpoint failed: %s", self.rank, exc)
        if self.bus is None or not requests:
            return
        self.bus.answer(
            requests,
            lambda r: CheckpointFailed(
                source=self.bus.source,
                data=CheckpointFailedData(**self._fields(r), step=step, error=str(exc), error_type=type(exc).__name__),
            ),
            ctx,
        )

    def expect_remote(self, step: int, requests: list[CheckpointRequestData]) -> None:
        """``requests`` were answered with ``step``: raise them to ``remote`` once it is copied."""
        if self.bus is not None:
            with self._lock:
                self._remote_waiting[step] = list(requests)

    def forget_remote(self, step: int) -> None:
        with self._lock:
            self._remote_waiting.pop(step, None)

    def expect_replicated(self, step: int, requests: list[CheckpointRequestData]) -> None:
        """``requests`` were answered with ``step``: when the node tier's copies land (maybe
        already), each of this node's ranks answers them again with the raised durability."""
        if self.bus is None:
            return
        with self._lock:
            done = self._replicated.pop(step, None)
            if done is None:
                self._replica_waiting[step] = list(requests)
                _trim(self._replica_waiting)
        if done is not None:
            self._publish_replicated(requests, step, *done)

    def replicated(self, step: int, ranks: list[tuple[int, str, int]], level: str, path: str) -> None:
        """This node's ranks' files of ``step`` are on the peers: ``level`` (``replicated:k``).
        Runs on the replication thread, before or after the requests' first acks were sent."""
        with self._lock:
            requests = self._replica_waiting.pop(step, None)
            if requests is None:  # the replication ended before the first acks went out
                self._replicated[step] = (ranks, level, path)
                _trim(self._replicated)
                return
        self._publish_replicated(requests, step, ranks, level, path)

    def _publish_replicated(self, requests, step: int, ranks: list[tuple[int, str, int]], level: str, path: str):
        self._raise(requests, step, ranks, tier="local", path=path, level=level)
        done = [r for r, *_ in ranks]
        log.info("rank %d: step %d on the peers: acks of rank(s) %s raised to %s", self.rank, step, done, level)

    def _raise(self, requests, step: int, ranks: list[tuple[int, str, int]], *, tier: str, path: str, level: str):
        """A second ``ckpt.durable`` to each request for each of ``ranks`` (rank, manifest digest,
        bytes): the same checkpoint, now at ``level``."""
        if self.bus is None:
            return
        for r in requests:
            mine = next((x for x in ranks if x[0] == self.rank), None)
            named = spans(sorted(x[0] for x in ranks))
            if r.acks == "job" and mine is not None and self.rank == 0 and len(named) <= MAX_RANK_SPANS:
                # one ack for the ranks named: rank 0's remote copy holds every rank's files
                data = CheckpointDurableData(
                    **self._fields(r),
                    step=step,
                    tier=tier,
                    path=path,
                    bytes=mine[2],
                    digest=mine[1],
                    durability=level,
                    ranks=named,
                )
                self.bus.publish_nowait(CheckpointDurable(source=self.bus.source, data=data))
                continue
            for rank, digest, nbytes in ranks:
                data = CheckpointDurableData(
                    **{**self._fields(r), "rank": rank},
                    step=step,
                    tier=tier,
                    path=path,
                    bytes=nbytes,
                    digest=digest,
                    durability=level,
                )
                self.bus.publish_nowait(CheckpointDurable(source=self.bus.source, data=data))

    def remote_copied(self, step: int, url: str) -> None:
        """The requests answered with ``step`` are now on the remote tier too: a second ack per
        rank (rank 0 speaks for all: the copy holds every rank's files) raises their durability
        to ``remote``. Runs on the remote copier's thread."""
        with self._lock:
            requests = self._remote_waiting.pop(step, [])
        if self.bus is None or not requests:
            return
        directory = L.step_dir(self.local_root, self.job, step)
        try:
            commit = L.read_commit(self.fs, directory)
            sizes = {}
            for rank in commit["manifests"]:
                with open(os.path.join(directory, L.manifest_name(int(rank))), "rb") as f:
                    sizes[int(rank)] = sum(int(x["size"]) for x in json.loads(f.read())["files"].values())
        except (OSError, ValueError, KeyError, CheckpointError) as exc:
            log.warning("step %d reached %s but its acks could not be raised: %s", step, url, exc)
            return
        ranks = [(int(rank), digest, sizes.get(int(rank), 0)) for rank, digest in sorted(commit["manifests"].items())]
        self._raise(requests, step, ranks, tier="remote", path=url, level="remote")
        log.info("step %d on the remote tier: acks raised to durability remote", step)


def spans(ranks: list[int]) -> list[tuple[int, int]]:
    """Ascending ranks as [first, last] spans: ``[0, 1, 2, 5]`` -> ``[(0, 2), (5, 5)]``."""
    out: list[tuple[int, int]] = []
    for r in ranks:
        if out and r == out[-1][1] + 1:
            out[-1] = (out[-1][0], r)
        else:
            out.append((r, r))
    return out


def _trim(pending: dict, keep: int = 16) -> None:
    """Only the newest steps wait (a replication or a request that never comes is forgotten)."""
    for step in sorted(pending)[:-keep]:
        del pending[step]
