"""The runner's clock: the event loop's own (``loop.time()``, which is ``time.monotonic()`` on
asyncio's loops). Every plan is made at its ``now``, and every wait, timer and deadline of the
runner is on it, so a test runs the runner on a loop with virtual time (minutes of soft-off
waits and power-on ramps in milliseconds) with nothing else to fake."""

from __future__ import annotations

import asyncio


def now() -> float:
    return asyncio.get_running_loop().time()


async def sleep_until(at: float) -> None:
    """Sleep until the clock reaches ``at`` (no wait when it has)."""
    wait = at - now()
    if wait > 0:
        await asyncio.sleep(wait)
