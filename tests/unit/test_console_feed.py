"""The console feed stops even when a source swallows a cancellation (Python 3.11's
``asyncio.wait_for`` can, inside nats.py): a CI run hung 300 s in the console's stop."""

from __future__ import annotations

import asyncio

from powerguard.console import ConsoleState, Feed
from powerguard.console import feed as feed_module


async def test_feed_stop_survives_a_swallowed_cancellation(monkeypatch) -> None:
    monkeypatch.setattr(feed_module, "STOP_WAIT_S", 0.2)
    feed = Feed(bus=None, state=ConsoleState())  # type: ignore[arg-type]  # the sources below use no bus
    swallowed = 0

    async def source() -> None:  # shaped like the feed's loops: retry until stopped
        nonlocal swallowed
        while not feed._stopped:
            try:
                await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                if swallowed == 0:  # the library call ate it: the loop goes on
                    swallowed += 1
                    continue
                raise

    async def stubborn() -> None:  # ignores the flag too: only a repeated cancel ends it
        nonlocal swallowed
        for _ in range(2):
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                swallowed += 1
        await asyncio.sleep(3600)

    feed._tasks = [asyncio.create_task(source()), asyncio.create_task(stubborn())]
    await asyncio.sleep(0.1)
    await asyncio.wait_for(feed.stop(), 30)
    assert all(t.done() for t in feed._tasks)
    assert swallowed == 3
