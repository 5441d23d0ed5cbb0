"""The hold: after a checkpoint whose request says ``then="pause"``, every rank waits at that
step boundary until the ranks are released (power back), ``pause_max_s`` passes, or the job
is stopped. The ranks decide together, every ``poll_s``, on the agent's agreement group (the
training's own groups see no collective while paused); a request that arrives meanwhile is
handed back to the caller, which checkpoints the same state again (and, when it asks for a
pause too, :meth:`Hold.join` adds its saga). The ranks leave the pause once every saga that
paused them released it: a drill that gave way to a real outage releases its own pause, never
the real saga's.

The caller drives: :meth:`Hold.begin`, then :meth:`Hold.poll` until it says go, then
:meth:`Hold.end` (which returns how long the pause lasted).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import torch

from powerguard.schemas import CheckpointRequestData

from ._ranks import Ranks

log = logging.getLogger("powerguard.ckpt_agent")


@dataclass(frozen=True)
class Pause:
    step: int
    sagas: frozenset[str | None]
    limit_s: float | None  # the shortest pause_max_s of the requests, None: until released
    started: float


@dataclass(frozen=True)
class Poll:
    go: bool  # every rank leaves the pause now
    another: bool  # some rank has a new request: checkpoint this step again
    pending: Any  # this rank's pending request (None when another rank's is the new one)


class Hold:
    def __init__(self, bus: Any, ranks: Ranks, *, poll_s: float) -> None:
        self.bus, self.ranks, self.poll_s = bus, ranks, poll_s

    def begin(self, step: int, requests: list[CheckpointRequestData]) -> Pause:
        limits = [r.pause_max_s for r in requests if r.pause_max_s]
        log.info(
            "rank %d: paused at step %d after the checkpoint (until power returns or the stop)", self.ranks.rank, step
        )
        if self.bus is not None:
            self.bus.set_paused(step)
        return Pause(step, frozenset(r.saga_id for r in requests), min(limits) if limits else None, time.monotonic())

    def join(self, pause: Pause, requests: list[CheckpointRequestData]) -> Pause:
        """The pause goes on for these requests too (those that ask for one): their sagas must
        release it as well, and the shortest ``pause_max_s`` counts."""
        pausing = [r for r in requests if r.then == "pause"]
        limits = [x for x in (pause.limit_s, *(r.pause_max_s for r in pausing)) if x]
        sagas = pause.sagas | {r.saga_id for r in pausing}
        return Pause(pause.step, sagas, min(limits) if limits else None, pause.started)

    def poll(self, pause: Pause) -> Poll:
        """One decision of every rank together (a collective on the agreement group)."""
        released = self.bus is None or self.bus.released(set(pause.sagas))
        if pause.limit_s is not None and time.monotonic() - pause.started >= pause.limit_s and not released:
            log.warning("rank %d: no release after %.0fs paused; training on", self.ranks.rank, pause.limit_s)
            released = True
        pending = self.bus.pending() if self.bus is not None else None
        flags = torch.tensor([1 if released else 0, 1 if pending else 0], dtype=torch.int64)
        if self.ranks.distributed:
            self.ranks.wait(self.ranks.start_max(flags), max(60.0, 10 * self.poll_s))
        go, another = (bool(x) for x in flags.tolist())
        return Poll(go, another, pending)

    def wait(self) -> None:
        time.sleep(self.poll_s)

    def end(self, pause: Pause) -> float:
        """The pause is over (released, or left by an error): the seconds it lasted."""
        took = time.monotonic() - pause.started
        if self.bus is not None:
            self.bus.set_paused(None)
        log.info("rank %d: released at step %d after %.1fs paused", self.ranks.rank, pause.step, took)
        return took
