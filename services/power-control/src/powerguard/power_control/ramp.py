"""The power-on ramp: how fast a restore may add load to the grid or the generator.

Thousands of nodes switched on together trip breakers (inrush) and outrun a generator's or the
utility's ramp. The ramp spaces node power-ons by rates: nodes per minute for the site, kW per
minute for the site (each node's figure from the settings), and nodes per minute per PDU (a
breaker feeds a PDU). A node starts when every scope it belongs to has room: each scope has a
"next free" time, and a node of cost c moves it by c / rate, so starts are evenly spaced (no
burst) and the ramp's total time is (sum of costs) / rate.

A reservation is a plan: a node can start late (its BMC session took long to set up under
load), and its command can take a while to reach the device once sent. Neither may put two
power-ons closer than the rates allow. So the ramp also follows the actual starts: a node is
in flight from :meth:`Ramp.started` (its command is going out) to :meth:`Ramp.landed` (the
device answered), and :meth:`Ramp.ready_at` lets the next node of a scope start only once no
node of it is in flight and ``cost`` has passed since the last one landed or started, whichever
is later. The device received the command somewhere in between, so actual power-ons are at
least ``cost`` apart whatever the delays; the price is the command's round trip per node.

Pure: every method takes the clock's ``now``; nothing here sleeps.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field


class RampSettings(BaseModel):
    """``power_control.ramp`` in the site file (every rate optional; none: no ramp)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    nodes_per_min: float | None = Field(default=None, gt=0, description="Site: node power-ons per minute")
    kw_per_min: float | None = Field(default=None, gt=0, description="Site: kW of node load added per minute")
    pdu_nodes_per_min: float | None = Field(
        default=None, gt=0, description="Per PDU (one breaker): node power-ons per minute"
    )
    node_kw: float = Field(default=10.0, gt=0, description="A node's draw when it runs (kW), for kw_per_min")
    node_kw_by_node: dict[str, float] = Field(default_factory=dict, description="Nodes that draw otherwise (kW)")

    @property
    def enabled(self) -> bool:
        return any(r is not None for r in (self.nodes_per_min, self.kw_per_min, self.pdu_nodes_per_min))

    def kw(self, node: str) -> float:
        return self.node_kw_by_node.get(node, self.node_kw)


@dataclass
class Ramp:
    """Reservations of start times against the settings' rates (one per power-control)."""

    settings: RampSettings
    _next: dict[str, float] = field(default_factory=dict)  # scope -> the earliest next start (the plan)
    _free: dict[str, float] = field(default_factory=dict)  # scope -> last actual start/landing + its cost
    _flying: dict[str, int] = field(default_factory=dict)  # scope -> commands sent, not yet answered

    def _scopes(self, node: str, pdus: Sequence[str]) -> list[tuple[str, float]]:
        """(scope, seconds this node occupies it)."""
        s = self.settings
        scopes: list[tuple[str, float]] = []
        if s.nodes_per_min:
            scopes.append(("site:nodes", 60.0 / s.nodes_per_min))
        if s.kw_per_min:
            scopes.append(("site:kw", 60.0 * s.kw(node) / s.kw_per_min))
        if s.pdu_nodes_per_min:
            scopes += [(f"pdu:{p}", 60.0 / s.pdu_nodes_per_min) for p in sorted(set(pdus))]
        return scopes

    def costs(self, node: str, pdus: Sequence[str]) -> dict[str, float]:
        """Scope -> the seconds ``node`` (fed by ``pdus``) occupies it: two starts in a scope are this far apart."""
        return dict(self._scopes(node, pdus))

    def scopes(self, node: str, pdus: Sequence[str]) -> tuple[str, ...]:
        """The scopes ``node`` (fed by ``pdus``) counts against."""
        return tuple(scope for scope, _ in self._scopes(node, pdus))

    def reserve(self, node: str, pdus: Sequence[str], now: float) -> float:
        """When ``node`` (fed by ``pdus``) may start, at the earliest ``now``; the slot is taken."""
        scopes = self._scopes(node, pdus)
        start = max([now, *(self._next.get(scope, now) for scope, _ in scopes)])
        for scope, cost in scopes:
            self._next[scope] = start + cost
        return start

    def book(self, node: str, pdus: Sequence[str], start: float) -> None:
        """Take the slot a plan gave ``node`` (plans.restore_plan reserved it on a copy of this
        ramp): the runner books what the plan decided, it never reserves a schedule of its own."""
        for scope, cost in self._scopes(node, pdus):
            self._next[scope] = max(self._next.get(scope, start), start + cost)

    def copy(self) -> Ramp:
        """This ramp's bookings, for a plan to reserve on without changing them."""
        return Ramp(self.settings, dict(self._next), dict(self._free), dict(self._flying))

    def ready_at(self, node: str, pdus: Sequence[str]) -> float:
        """The earliest ``node`` may start given the nodes that actually started (0: any time;
        ``inf``: a node of one of its scopes is in flight, wait until it lands)."""
        scopes = [scope for scope, _ in self._scopes(node, pdus)]
        if any(self._flying.get(scope) for scope in scopes):
            return math.inf
        return max([0.0, *(self._free.get(scope, 0.0) for scope in scopes)])

    def started(self, node: str, pdus: Sequence[str], now: float) -> None:
        """``node``'s command goes out at ``now``; a plan that a late start overtook moves back."""
        for scope, cost in self._scopes(node, pdus):
            self._flying[scope] = self._flying.get(scope, 0) + 1
            self._free[scope] = max(self._free.get(scope, 0.0), now + cost)
            self._next[scope] = max(self._next.get(scope, now), now + cost)

    def landed(self, node: str, pdus: Sequence[str], now: float) -> None:
        """``node``'s command was answered (or failed) at ``now``: its scopes are free ``cost`` later."""
        for scope, cost in self._scopes(node, pdus):
            self._flying[scope] = max(0, self._flying.get(scope, 0) - 1)
            self._free[scope] = max(self._free.get(scope, 0.0), now + cost)
            self._next[scope] = max(self._next.get(scope, now), now + cost)

    def horizon(self, now: float) -> float:
        """Seconds until every scope is free again (what the ramp still holds back)."""
        return max([0.0, *(t - now for t in (*self._next.values(), *self._free.values()))])
