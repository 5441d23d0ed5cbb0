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
# The coordinator's youngest generation is collected after this many allocations (Python's
# default: 700). A batch of 32,768 decoded acks holds ~15 tracked objects each until it is
# applied; at 700 the collector ran hundreds of times per batch and decoding an ack cost 11-14 µs
# instead of ~6 (bench/scale.py's ``ack_decode_cpu_us_per_rank``).
GEN0_THRESHOLD = 50_000


def tune() -> None:
    """The coordinator process's collector thresholds (set once, at its start)."""
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GEN0_THRESHOLD, max(gen1, 20), max(gen2, 20))


def settle() -> float:
    """Collect everything, then freeze the survivors; returns the seconds it took."""
    t = time.perf_counter()
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    return time.perf_counter() - t


def keep() -> None:
    """After a batch of several inputs in an outage (not on the clock's ticks): what survived it
    (the records, the store's memos, the agent registry) moves to the generation the collector
    never walks (``gc.freeze``: a constant-time list merge), so the collections that 100,000
    decoded acks trigger walk only the objects of the batch in hand, not every record again
    (bench/scale.py, 100,000 ranks: the last of the acks arriving over one second was applied
    ~0.2 s sooner with it, 2.28 against 2.49 s, before the thresholds of :func:`tune`). Frozen
    objects are still freed by reference counting; a cycle among them waits for the next
    :func:`settle` (with no saga open)."""
    gc.freeze()


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
