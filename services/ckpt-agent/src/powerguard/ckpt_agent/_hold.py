"""The hold: after a checkpoint whose request says ``then="pause"``, every rank waits at that
step boundary until the ranks are released (power back), ``pause_max_s`` passes, or the job
is stopped. The ranks decide together, every ``poll_s``, on the agent's agreement group (the
training's own groups see no collective while paused); a request that arrives meanwhile is
handed back to the caller, which checkpoints the same state again (and, when it asks for a
pause too, :meth:`Hold.join` adds its saga). The ranks leave the pause once every saga that
paused them released it: a drill that gave way to a real outage releases its own pause, never
the real saga's.

A SIGTERM (the job's stop) ends the pause at once, in every integration: a framework that
takes the signal for itself (Lightning's handler only sets a flag its loop reads between
batches) would leave the ranks paused until the launcher kills them (30 s of battery). The pause
installs a handler that calls the one before it, then leaves with ``SystemExit(143)``. The
pause's own collective is waited for in short steps, so the handler runs on every rank even
while one waits for another: Lightning 2.6's handler broadcasts, and a rank held in a blocking
wait never joined it (both waited until torchrun killed them, 30 s later: seen in CI).

The caller drives: :meth:`Hold.begin`, then :meth:`Hold.poll` until it says go, then
:meth:`Hold.end` (which returns how long the pause lasted).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from dataclasses import dataclass, field
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
    stopped: threading.Event = field(default_factory=threading.Event)  # SIGTERM came
    previous: Any = None  # the SIGTERM handler before the pause
    installed: bool = False  # ours is installed (only the main thread can)


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
        pause = Pause(step, frozenset(r.saga_id for r in requests), min(limits) if limits else None, time.monotonic())
        pause = self._on_sigterm(pause)  # before the log line: whoever reads "paused" may stop the job at once
        log.info(
            "rank %d: paused at step %d after the checkpoint (until power returns or the stop)", self.ranks.rank, step
        )
        return pause

    @staticmethod
    def _on_sigterm(pause: Pause) -> Pause:
        """A SIGTERM during the pause marks it stopped, after the handler that was there (the
        job's own, a framework's) has run."""
        if threading.current_thread() is not threading.main_thread():
            return pause
        previous = signal.getsignal(signal.SIGTERM)

        def stopped(signum: int, frame: Any) -> None:
            if previous == signal.SIG_IGN:  # the job ignores SIGTERM on purpose: so does the pause
                return
            pause.stopped.set()
            if callable(previous):
                previous(signum, frame)
            elif previous == signal.SIG_DFL:
                raise SystemExit(143)

        signal.signal(signal.SIGTERM, stopped)
        return Pause(pause.step, pause.sagas, pause.limit_s, pause.started, pause.stopped, previous, True)

    def join(self, pause: Pause, requests: list[CheckpointRequestData]) -> Pause:
        """The pause goes on for these requests too (those that ask for one): their sagas must
        release it as well, and the shortest ``pause_max_s`` counts."""
        pausing = [r for r in requests if r.then == "pause"]
        limits = [x for x in (pause.limit_s, *(r.pause_max_s for r in pausing)) if x]
        sagas = pause.sagas | {r.saga_id for r in pausing}
        limit = min(limits) if limits else None
        return Pause(pause.step, sagas, limit, pause.started, pause.stopped, pause.previous, pause.installed)

    def poll(self, pause: Pause) -> Poll:
        """One decision of every rank together (a collective on the agreement group). Raises
        ``SystemExit(143)`` once the job was told to stop (SIGTERM): no collective after that."""
        if pause.stopped.is_set():
            self._stopped(pause)
        released = self.bus is None or self.bus.released(set(pause.sagas))
        if pause.limit_s is not None and time.monotonic() - pause.started >= pause.limit_s and not released:
            log.warning("rank %d: no release after %.0fs paused; training on", self.ranks.rank, pause.limit_s)
            released = True
        pending = self.bus.pending() if self.bus is not None else None
        flags = torch.tensor([1 if released else 0, 1 if pending else 0], dtype=torch.int64)
        if self.ranks.distributed:
            work = self.ranks.start_max(flags)
            if not self.ranks.wait_unless(work, max(60.0, 10 * self.poll_s), pause.stopped):
                self._stopped(pause)  # the other ranks are stopping too: they will not join
        go, another = (bool(x) for x in flags.tolist())
        return Poll(go, another, pending)

    def _stopped(self, pause: Pause) -> None:
        log.info("rank %d: stopped (SIGTERM) while paused at step %d", self.ranks.rank, pause.step)
        raise SystemExit(143)

    def wait(self, pause: Pause | None = None) -> None:
        if pause is not None:
            pause.stopped.wait(self.poll_s)  # a SIGTERM ends the wait at once
        else:
            time.sleep(self.poll_s)

    def end(self, pause: Pause) -> float:
        """The pause is over (released, or left by an error): the seconds it lasted."""
        took = time.monotonic() - pause.started
        if pause.installed and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, pause.previous if pause.previous is not None else signal.SIG_DFL)
        log.info("rank %d: released at step %d after %.1fs paused", self.ranks.rank, pause.step, took)
        return took
