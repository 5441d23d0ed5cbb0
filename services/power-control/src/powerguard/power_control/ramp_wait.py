"""Waiting for a node's slot in the power-on ramp (ramp.py is the pure rule; this sleeps):
:class:`RampSlot` waits for the planned start, then for the nodes that actually started to
leave room; :class:`RampSignal` wakes one waiter per landing."""

from __future__ import annotations

import asyncio
import contextlib
import math
from dataclasses import dataclass

from . import clock
from .drivers.base import sleep_until
from .ramp import Ramp


class RampSignal:
    """Wakes the node waiting in the ramp when a command lands (the pure ramp has no event), and
    queues the nodes whose planned start has passed: per set of ramp scopes, one node at a time
    waits for room (first come, first served), so a landing wakes one waiter, not every node
    behind the plan (with thousands behind it, waking them all at every landing cost more CPU
    than the ramp's slots have time)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._turns: dict[tuple[str, ...], asyncio.Lock] = {}

    def turn(self, scopes: tuple[str, ...]) -> asyncio.Lock:
        return self._turns.setdefault(scopes, asyncio.Lock())

    def pulse(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    async def wait(self, timeout_s: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._event.wait(), timeout_s)


@dataclass
class RampSlot:
    """A node's slot in the power-on ramp: the planned ``start``; ``wait()`` returns at the plan
    or later, once the nodes that actually started leave room, and counts the command as sent;
    ``done()`` when it was answered (see ramp.py: actual power-ons never closer than the rates)."""

    ramp: Ramp | None
    node: str
    pdus: tuple[str, ...]
    start: float
    signal: RampSignal
    _flying: bool = False

    async def wait(self) -> None:
        await sleep_until(self.start)
        if self.ramp is None:
            return
        self.done()  # a retry: the attempt before it is over
        async with self.signal.turn(self.ramp.scopes(self.node, self.pdus)):
            while (ready := self.ramp.ready_at(self.node, self.pdus)) > clock.now():
                if ready == math.inf:  # a command in flight: until it lands
                    await self.signal.wait(60.0)
                else:
                    await sleep_until(ready)
            self.ramp.started(self.node, self.pdus, clock.now())  # no await since the check
            self._flying = True

    def done(self) -> None:
        if self._flying and self.ramp is not None:
            self.ramp.landed(self.node, self.pdus, clock.now())
            self._flying = False
            self.signal.pulse()
