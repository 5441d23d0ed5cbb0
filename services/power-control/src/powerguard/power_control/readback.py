"""Which nodes power-control reads back on its own, and what a read-back means (pure).

A saga waits for a node's result: ``off`` after its shutdown, ``ready`` after its power-on.
When the sequence that should bring that result failed (a dead BMC, a power-on that never
answered) the saga would wait until its timeout even after an operator fixed the node by hand
(``powerguard power on``, the BMC's own button). So every node whose last command has not
reached its result is read back every ``interval_s``; a read that shows the result is reported
as a ``node.state`` event for the saga of that command, and the node leaves the watch.
Every method takes the clock's ``now``; nothing here sleeps or does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Want = Literal["off", "ready"]


@dataclass
class Expected:
    saga_id: str
    want: Want
    since: float
    next_at: float


class ReadBack:
    def __init__(self, *, interval_s: float, window_s: float) -> None:
        self.interval_s = interval_s
        self.window_s = window_s  # a node is read back this long after its last command at most
        self._nodes: dict[str, Expected] = {}

    def expect(self, node: str, saga_id: str, want: Want, now: float) -> None:
        """A command for ``node`` was taken: its result is ``want`` (the newest command wins)."""
        self._nodes[node] = Expected(saga_id, want, now, now + self.interval_s)

    def reported(self, node: str, state: str) -> None:
        """A sequence (or a read-back) reported this state for the node."""
        exp = self._nodes.get(node)
        if exp is not None and exp.want == state:
            del self._nodes[node]

    def due(self, now: float, busy: set[str] = frozenset()) -> list[tuple[str, Expected]]:
        """Nodes to read now (a node whose sequence still runs is left to it); forgets the ones
        past the window."""
        out = []
        for node, exp in list(self._nodes.items()):
            if now - exp.since > self.window_s:
                del self._nodes[node]
            elif now >= exp.next_at and node not in busy:
                exp.next_at = now + self.interval_s
                out.append((node, exp))
        return out

    def __contains__(self, node: str) -> bool:
        return node in self._nodes


def meaning(want: Want, power: str, probe_ok: bool | None) -> Want | None:
    """What a read-back says for the saga: the result it waits for, or None (not there yet)."""
    if want == "off" and power == "off":
        return "off"
    if want == "ready" and power == "on" and probe_ok is not False:
        return "ready"
    return None
