"""Keeping Python's cyclic garbage collector out of an outage's first second.

At 100k ranks the coordinator holds ~100k agent records; a full (generation 2) collection walks
all of them and took ~0.2 s here. Allocation-heavy work triggers one, and the first write of a
large saga is such work: measured in ``bench/fanout.py``, a full collection landed inside it and
delayed every checkpoint request by that much. While no saga is open the coordinator collects
and then freezes what survived (``gc.freeze``: long-lived objects move to a generation the
collector never walks), so an outage starts with only young objects to collect. Frozen objects
are still freed by reference counting; a cycle among them waits for the next settle, which
unfreezes, collects and freezes again (pure timing: the clock is injected)."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable

SETTLE_EVERY_S = 60.0


def settle() -> float:
    """Collect everything, then freeze the survivors; returns the seconds it took."""
    t = time.perf_counter()
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    return time.perf_counter() - t


class Settler:
    """Calls :func:`settle` at most every ``every_s`` when asked while idle."""

    def __init__(self, *, every_s: float = SETTLE_EVERY_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s, self.clock = every_s, clock
        self._last: float | None = None

    def idle(self) -> float | None:
        """The coordinator has no open saga: settle if due; the seconds it took, or None."""
        now = self.clock()
        if self._last is not None and now - self._last < self.every_s:
            return None
        self._last = now
        return settle()
