"""A quiescent phase (``guard.quiescent()``): while the training thread evaluates, logs or
reloads data, the training state does not change, so a checkpoint request that comes meanwhile
is served at once, of the last step's state, by a thread of the agent instead of waiting for the
next step boundary (an evaluation of minutes would otherwise hold the power checkpoint past its
deadline).

Every ``poll_s`` the ranks' threads agree, with an all-reduce on the agent's agreement group
(the training thread leaves it alone inside the phase), whether some rank has a request pending
and whether some rank is still inside its phase; a pending request is checkpointed by every
rank together. A rank that leaves its phase keeps taking part until the round in which every
rank has left: no rank trains on while another still checkpoints the last step.

The agent drives: :meth:`Quiet.begin` starts the thread with the function that serves a
request, :meth:`Quiet.end` joins it and returns what it served (or raises what failed it).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from powerguard.schemas import CheckpointRequestData

from ._ranks import Ranks

log = logging.getLogger("powerguard.ckpt_agent")


@dataclass(frozen=True)
class Served:
    """One checkpoint the phase's thread took: the requests it answered, and whether it is durable."""

    requests: list[CheckpointRequestData]
    durable: bool


@dataclass
class _Run:
    thread: threading.Thread
    leaving: threading.Event = field(default_factory=threading.Event)
    served: list[Served] = field(default_factory=list)
    error: BaseException | None = None


class Quiet:
    def __init__(self, ranks: Ranks, bus: Any, *, poll_s: float, timeout_s: float) -> None:
        self.ranks, self.bus, self.poll_s, self.timeout_s = ranks, bus, poll_s, timeout_s
        self._run: _Run | None = None

    @property
    def active(self) -> bool:
        return self._run is not None

    def begin(self, serve: Callable[[Any], Served | None]) -> None:
        """Start serving requests with ``serve(pending)`` (every rank calls it in the same round;
        None: nothing to serve after all)."""
        if self._run is not None:
            raise RuntimeError("guard.quiescent() is already open on this rank (it does not nest)")
        run = _Run(threading.Thread(target=lambda: self._rounds(run, serve), name="pg-ckpt-quiet", daemon=True))
        self._run = run
        run.thread.start()

    def end(self) -> list[Served]:
        """Leave the phase: every rank's thread meets the others' at the round where all have
        left; returns the checkpoints taken meanwhile (raises what stopped the rounds)."""
        run, self._run = self._run, None
        if run is None:
            return []
        run.leaving.set()
        run.thread.join()
        if run.error is not None:
            raise run.error
        return run.served

    def _rounds(self, run: _Run, serve: Callable[[Any], Served | None]) -> None:
        try:
            while True:
                pending = self.bus.pending() if self.bus is not None else None
                flags = torch.tensor([1 if pending else 0, 0 if run.leaving.is_set() else 1], dtype=torch.int64)
                if self.ranks.distributed:
                    self.ranks.wait(self.ranks.start_max(flags), self.timeout_s)
                someone_asked, someone_stays = (bool(x) for x in flags.tolist())
                if someone_asked:
                    done = serve(pending)
                    if done is not None:
                        run.served.append(done)
                if not someone_stays:
                    return
                run.leaving.wait(self.poll_s)
        except BaseException as exc:  # handed to the training thread at the end of its phase
            log.error("rank %d: the quiescent phase's checkpoint thread stopped: %s", self.ranks.rank, exc)
            run.error = exc
