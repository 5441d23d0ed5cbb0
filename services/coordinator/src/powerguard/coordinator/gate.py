"""The coordinator's one lock, with power batches first."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class Gate:
    """The coordinator's one lock, with power batches first: a batch of results or a tick waits
    while a power batch waits, so a flood of acks never holds a power event back by more than
    the one batch already being applied."""

    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self._urgent = 0
        self._clear = asyncio.Event()
        self._clear.set()

    @contextlib.asynccontextmanager
    async def urgent(self) -> AsyncIterator[None]:
        self._urgent += 1
        self._clear.clear()
        try:
            async with self._lock:
                yield
        finally:
            self._urgent -= 1
            if not self._urgent:
                self._clear.set()

    @contextlib.asynccontextmanager
    async def normal(self) -> AsyncIterator[None]:
        await self._clear.wait()
        async with self._lock:
            yield
