"""The test suite's one way to wait: for a condition, bounded, named in the failure.

``eventually`` polls a condition that has no event to await (a recorder's list, a file, a
process); ``processed`` waits until a service's durable consumer has acknowledged the
stream up to a sequence, the event that shows an input was handled (to prove that handling
it did nothing, never sleep: a slow machine passes a sleep without testing anything).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any

Details = Callable[[], str] | None


def _timed_out(timeout: float, what: str, details: Details) -> AssertionError:
    more = f"\n{details()}" if details is not None else ""
    return AssertionError(f"timed out after {timeout}s waiting for {what}{more}")


async def eventually(
    cond: Callable[[], Any | Awaitable[Any]],
    timeout: float = 15.0,
    what: str = "condition",
    *,
    every: float = 0.02,
    details: Details = None,
) -> Any:
    """Poll ``cond`` (plain or async) until it is truthy; return its value. Raises
    AssertionError naming ``what`` (and ``details()``: a peer's log tail) after ``timeout``
    seconds; an exception ``cond`` raises (a peer that exited) ends the wait at once."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise _timed_out(timeout, what, details)
        await asyncio.sleep(every)


def eventually_sync(
    cond: Callable[[], Any],
    timeout: float = 10.0,
    what: str = "condition",
    *,
    every: float = 0.02,
    details: Details = None,
) -> Any:
    """:func:`eventually` for a test without an event loop (a peer started or driven by threads)."""
    deadline = time.monotonic() + timeout
    while not (value := cond()):
        if time.monotonic() > deadline:
            raise _timed_out(timeout, what, details)
        time.sleep(every)
    return value


async def processed(bus, durable: str, seq: int, timeout: float = 15.0) -> None:
    """Wait until the durable consumer ``durable`` has acknowledged every message of the
    events stream up to ``seq`` (its service handled them; a bounded read of the stream)."""

    stream: list[str] = []  # the stream that holds the durable (the events' or the jobs')

    async def acked() -> bool:
        if not stream:
            for name in bus.names.streams:
                try:
                    await bus.js.consumer_info(name, durable)
                except Exception:  # not on this stream
                    continue
                stream.append(name)
                break
            else:
                return False
        info = await bus.js.consumer_info(stream[0], durable)
        return info.ack_floor is not None and (info.ack_floor.stream_seq or 0) >= seq

    await eventually(acked, timeout, f"{durable} to handle the stream up to {seq}", every=0.05)
