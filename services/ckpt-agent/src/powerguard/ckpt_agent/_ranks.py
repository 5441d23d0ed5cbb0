"""The agent's own process groups and the collectives it runs on them: gather, a barrier on
a success flag, an all-reduce with a bounded wait. Never the training's own group.

Three gloo groups: one for the step agreement and the hold (the training thread), one for
DCP and the commit (also the background thread of a periodic save), one for the node tier's
replication (leaders, in the background, with its own timeout). One process (no
``torch.distributed``): every collective is the identity.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from .errors import StepAgreementTimeout

log = logging.getLogger("powerguard.ckpt_agent")

REPLICA_TIMEOUT_S = 120.0  # a peer that stops answering ends that replication (the local commit stands)


class Ranks:
    """This rank, the world, and the agent's groups (made at construction, on every rank alike)."""

    def __init__(self, *, replication: bool = False) -> None:
        self.distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if self.distributed else 0
        self.world_size = dist.get_world_size() if self.distributed else 1
        self.agree_group = dist.new_group(backend="gloo") if self.distributed else None
        self.save_group = dist.new_group(backend="gloo") if self.distributed else None
        self.replica_group = (
            dist.new_group(backend="gloo", timeout=timedelta(seconds=REPLICA_TIMEOUT_S))
            if self.distributed and replication
            else None
        )

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` in rank order (all ranks must call it)."""
        if not self.distributed:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.save_group)
        return out

    def all_ok(self, ok: bool, timeout_s: float | None = None) -> bool:
        """All ranks agree that every rank succeeded (MIN of a flag)."""
        if not self.distributed:
            return ok
        flag = torch.tensor([1 if ok else 0], dtype=torch.int64)
        self.wait(dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self.save_group, async_op=True), timeout_s)
        return bool(flag.item())

    def start_max(self, flags: torch.Tensor) -> Any:
        """Start an all-reduce (MAX) of ``flags`` on the agreement group; the work to :meth:`wait` on."""
        return dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.agree_group, async_op=True)

    def wait(self, work: Any, timeout_s: float | None) -> None:
        """Wait for a collective; :class:`StepAgreementTimeout` naming this rank after ``timeout_s``."""
        if timeout_s is None:
            work.wait()
            return
        try:
            work.wait(timedelta(seconds=max(0.01, timeout_s)))
        except RuntimeError as exc:
            raise StepAgreementTimeout(
                f"rank {self.rank}: not every rank reached the step boundary within {timeout_s:.1f}s "
                f"(a rank is hung or gone): {exc}"
            ) from None

    def wait_unless(self, work: Any, timeout_s: float, stop: threading.Event, *, tick_s: float = 0.01) -> bool:
        """Wait for a collective in short steps, so that a signal's handler runs meanwhile; False
        once ``stop`` is set before it completed. A blocking wait holds the main thread in C++,
        where no Python handler runs: a handler that itself runs a collective (Lightning 2.6
        broadcasts on SIGTERM) then waits for this rank, and this rank for it, until the launcher
        kills both (30 s of battery). :class:`StepAgreementTimeout` naming this rank after
        ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while not work.is_completed():
            if stop.wait(tick_s):
                return False
            if time.monotonic() >= deadline:
                raise StepAgreementTimeout(
                    f"rank {self.rank}: not every rank reached the step boundary within {timeout_s:.1f}s "
                    "(a rank is hung or gone)"
                )
        self.wait(work, timeout_s)  # completed: its error, if it failed
        return True

    def release(self, *, keep_replica: bool = False) -> None:
        """Destroy the agent's groups while the job's are still up (``keep_replica``: a copy still
        running keeps its group). Left to the garbage collector after the job's
        ``destroy_process_group()``, a gloo group's destructor hung now and then (1 of 4 ranks,
        ~3 runs in 4, torch 2.13, 4 ranks on 2 cores)."""
        groups = [self.agree_group, self.save_group]
        if not keep_replica:
            groups.append(self.replica_group)
            self.replica_group = None
        self.agree_group = self.save_group = None
        if not (self.distributed and dist.is_initialized()):
            return
        for group in (g for g in groups if g is not None):
            try:
                dist.destroy_process_group(group)
            except (RuntimeError, ValueError) as exc:  # already destroyed with the job's groups
                log.debug("rank %d: process group not destroyed: %s", self.rank, exc)
