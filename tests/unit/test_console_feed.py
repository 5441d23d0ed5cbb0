"""The console feed stops even when a source swallows a cancellation (Python 3.11's
``asyncio.wait_for`` can, inside nats.py): a CI run hung 300 s in the console's stop."""

from __future__ import annotations

import asyncio

from powerguard.console.feed import stop_tasks, watch_entries


async def test_feed_stop_survives_a_swallowed_cancellation() -> None:
    swallowed = 0

    async def source() -> None:  # shaped like the feed's loops: retry until cancelled
        nonlocal swallowed
        while True:
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

    tasks = [asyncio.create_task(source()), asyncio.create_task(stubborn())]
    await asyncio.sleep(0)  # both running
    assert await asyncio.wait_for(stop_tasks(tasks, wait_s=0.2), 30) == []
    assert all(t.done() for t in tasks)
    assert swallowed == 3


class _Entry:
    def __init__(self, key: str, value: bytes, operation: str | None = None) -> None:
        self.key, self.value, self.operation = key, value, operation


class _Watcher:
    """What nats.py's KV watcher yields: the current values, None, then changes."""

    def __init__(self, items: list) -> None:
        self.items, self.stopped = list(items), False

    def __aiter__(self):
        return self

    async def __anext__(self):
        if not self.items:
            raise StopAsyncIteration
        return self.items.pop(0)

    async def stop(self) -> None:
        self.stopped = True


async def test_a_restarted_watch_forgets_keys_deleted_while_it_was_down() -> None:
    have = {"saga.a": b"1", "saga.gone": b"1"}  # what the feed held before the watch restarted
    calls: list[tuple[str, bytes | None]] = []

    async def on_entry(key: str, value: bytes | None) -> None:
        calls.append((key, value))
        if value is None:
            have.pop(key, None)
        else:
            have[key] = value

    watcher = _Watcher([_Entry("saga.a", b"2"), None, _Entry("saga.b", b"3"), _Entry("saga.a", b"", "DEL")])

    async def starting():
        return watcher

    await watch_entries(starting(), on_entry, lambda: list(have))
    assert calls == [("saga.a", b"2"), ("saga.gone", None), ("saga.b", b"3"), ("saga.a", None)]
    assert have == {"saga.b": b"3"} and watcher.stopped
