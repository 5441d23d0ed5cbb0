"""An asyncio loop whose clock is virtual: when nothing is ready to run, time jumps to the next
timer, so a runner's minutes of waits (soft-off timeouts, power-on ramps, boots) pass in
milliseconds and every time the runner reads is exact. Each turn of the loop with work to do
costs a microsecond, so a task that spins yielding until a time comes (``sleep_until``'s last
millisecond) gets there."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
TURN_S = 1e-6


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        super().__init__()
        self._virtual = 1000.0

    def time(self) -> float:
        return self._virtual

    def _run_once(self) -> None:
        if self._ready:
            self._virtual += TURN_S
        else:  # the next timer that still counts (a cancelled one is dropped, never waited for)
            due = [h._when for h in self._scheduled if not h._cancelled]
            if due:
                self._virtual = max(self._virtual, min(due))
        super()._run_once()


def run(coro: Coroutine[Any, Any, T]) -> T:
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()
