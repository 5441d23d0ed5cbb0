"""The console's feed from the bus (read-only, the observer credential suffices): every event as
it is stored, the agents bucket, and the saga records polled from KV. Each source runs on its own
and logs its failures: a bad record or a lost connection never stops the others; after a NATS
reconnect or a coordinator restart the KV state is simply read again."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from powerguard.bus import Bus
from powerguard.schemas import AgentData, SiteConfig

from .state import ConsoleState

log = logging.getLogger("powerguard.console")

SAGA_POLL_S = 1.0
STOP_WAIT_S = 5.0  # per round of cancelling the sources on stop


class Feed:
    def __init__(self, bus: Bus, state: ConsoleState, *, site: SiteConfig | None = None) -> None:
        self.bus, self.state, self.site = bus, state, site
        self.histories: dict[str, list[dict[str, Any]]] = {}  # saga -> its transitions (the timeline picture)
        self._tasks: list[asyncio.Task] = []
        self._stopped = False

    async def start(self) -> None:
        await self._initial_power()
        self._tasks = [
            asyncio.create_task(self._events(), name="console-events"),
            asyncio.create_task(self._agents(), name="console-agents"),
            asyncio.create_task(self._sagas(), name="console-sagas"),
        ]

    async def stop(self) -> None:
        """Stop every source, bounded: a cancellation that a library call swallowed (Python
        3.11's ``wait_for`` can) is repeated, and the loops also end on the stop flag."""
        self._stopped = True
        live = [t for t in self._tasks if not t.done()]
        for _ in range(3):
            if not live:
                return
            for t in live:
                t.cancel()
            _, pending = await asyncio.wait(live, timeout=STOP_WAIT_S)
            live = list(pending)
        log.error("console feed sources did not stop: %s", ", ".join(t.get_name() for t in live))

    async def _initial_power(self) -> None:
        """The newest reading of every UPS of the site file (the stream keeps them)."""
        if self.site is None:
            return
        for ups in self.site.ups:
            got = await self.bus.last(self.bus.subjects.power(self.site.site, ups.name))
            if got is not None:
                self.state.apply(got.event)

    async def _events(self) -> None:
        while not self._stopped:
            try:
                async with self.bus.subscribe(subject=self.bus.subjects.all, deliver="new") as sub:
                    async for event in sub:
                        if self._stopped:
                            return
                        self.state.apply(event)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("event feed interrupted (%s); subscribing again", exc)
                await asyncio.sleep(1.0)

    async def _agents(self) -> None:
        while not self._stopped:
            try:
                kv = await self.bus.agents()
                watcher = await kv.raw.watchall()
                try:
                    async for entry in watcher:
                        if entry is None:
                            continue
                        if entry.operation in ("DEL", "PURGE") or not entry.value:
                            self.state.set_agent(entry.key, None)
                            continue
                        try:
                            self.state.set_agent(entry.key, AgentData.model_validate_json(entry.value))
                        except ValueError as exc:
                            log.warning("agent record %s ignored: %s", entry.key, exc)
                finally:
                    with contextlib.suppress(Exception):
                        await watcher.stop()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("agents watch interrupted (%s); watching again", exc)
                await asyncio.sleep(1.0)

    async def _sagas(self) -> None:
        from powerguard.coordinator.status import summarize
        from powerguard.coordinator.store import SagaStore

        store: SagaStore | None = None
        while not self._stopped:
            try:
                self.state.set_connected(self.bus.nc.is_connected)
                if store is None:
                    store = SagaStore(await self.bus.sagas())
                rows = []
                for rec, _ in await store.load(open_only=False):
                    row = summarize(rec, self.state.clock())
                    row["state_at"] = rec.history[-1].at if rec.history else rec.created_at
                    rows.append(row)
                    self.histories[rec.saga_id] = [
                        {"state": h.state.value, "at": h.at, "reason": h.reason} for h in rec.history
                    ]
                self.state.set_sagas(rows)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("saga records not read: %s", exc)
                self.state.set_connected(False)
            await asyncio.sleep(SAGA_POLL_S)
