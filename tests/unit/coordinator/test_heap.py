"""The idle coordinator settles its heap (collect, then freeze the survivors) at most every
``every_s``; a cycle frozen earlier is collected by the next settle."""

from __future__ import annotations

import gc
import weakref

from powerguard.coordinator.heap import Settler


class Node:
    pass


def test_settles_when_due_and_collects_cycles_frozen_by_an_earlier_settle() -> None:
    now = [100.0]
    heap = Settler(every_s=60.0, clock=lambda: now[0])
    try:
        a, b = Node(), Node()
        a.other, b.other = b, a  # a cycle: only the cyclic collector frees it
        alive = weakref.ref(a)
        assert heap.idle() is not None
        assert gc.get_freeze_count() > 0
        del a, b
        gc.collect()
        assert alive() is not None  # frozen: the collector does not walk it
        now[0] += 30.0
        assert heap.idle() is None  # not due
        now[0] += 31.0
        assert heap.idle() is not None
        assert alive() is None  # the next settle unfroze and collected it
    finally:
        gc.unfreeze()
