"""The console's feed from the bus (read-only, the observer credential suffices): every event as
it is stored, the agents bucket, and the site's published status (``pg_status``: each saga as
the coordinator publishes it, schemas/status.py; watched, so a site with thousands of past
outages costs nothing per second). Each source runs on its own and logs its failures: a bad record or a lost
connection never stops the others; after a NATS reconnect or a coordinator restart each watch
starts again and reads the current state."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from powerguard.bus import Bus, saga_status
from powerguard.bus.agents import identity_mismatch
from powerguard.schemas import AgentData, SagaStatus, SiteConfig

from .state import ConsoleState

log = logging.getLogger("powerguard.console")

SAGA_POLL_S = 1.0  # how often the saga rows are summarized again (from memory)
RESTART_S = 1.0  # a source that failed starts again after this long
STOP_WAIT_S = 5.0  # per round of cancelling the sources on stop


class Feed:
    def __init__(self, bus: Bus, state: ConsoleState, *, site: SiteConfig | None = None) -> None:
        self.bus, self.state, self.site = bus, state, site
        self.records: dict[str, SagaStatus] = {}  # saga -> its status as last published
        self._tasks: list[asyncio.Task] = []
        self._stopped = False

    async def start(self) -> None:
        await self._initial_power()
        self._tasks = [
            asyncio.create_task(self._keep("event feed", self._events), name="console-events"),
            asyncio.create_task(self._keep("agents watch", self._agents), name="console-agents"),
            asyncio.create_task(self._keep("saga records watch", self._sagas), name="console-sagas"),
            asyncio.create_task(self._summaries(), name="console-summaries"),
        ]

    async def stop(self) -> None:
        """Stop every source, bounded: a cancellation that a library call swallowed (Python
        3.11's ``wait_for`` can) is repeated, and the loops also end on the stop flag."""
        self._stopped = True
        live = await stop_tasks(self._tasks, wait_s=STOP_WAIT_S)
        if live:
            log.error("console feed sources did not stop: %s", ", ".join(t.get_name() for t in live))

    async def _initial_power(self) -> None:
        """The newest reading of every UPS of the site file (the stream keeps them)."""
        if self.site is None:
            return
        for ups in self.site.ups:
            got = await self.bus.last(self.bus.subjects.power(self.site.site, ups.name))
            if got is not None:
                self.state.apply(got.event)

    async def _keep(self, what: str, source: Callable[[], Awaitable[None]]) -> None:
        """Run a source until the feed stops; an error is logged and the source starts again."""
        while not self._stopped:
            try:
                await source()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("%s interrupted (%s); starting again", what, exc)
            if not self._stopped:
                await asyncio.sleep(RESTART_S)

    async def _events(self) -> None:
        async with self.bus.subscribe(subject=self.bus.subjects.all, deliver="new") as sub:
            async for event in sub:
                if self._stopped:
                    return
                self.state.apply(event)

    async def _agents(self) -> None:
        kv = await self.bus.agents()
        await self._watch(kv.raw.watchall(), self._agent, lambda: list(self.state.agents))

    async def _agent(self, key: str, value: bytes | None) -> None:
        """One ``pg_agents`` record, shown only as what its key says (the coordinator's rule,
        :func:`powerguard.bus.agents.identity_mismatch`): the server binds the key to the
        writer's job (and node); what the record says inside is only the writer's word."""
        if not value:
            self.state.set_agent(key, None)
            return
        try:
            agent = AgentData.model_validate_json(value)
        except ValueError as exc:
            log.warning("agent record %s ignored: %s", key, exc)
            return
        if (mismatch := identity_mismatch(agent, key)) is not None:
            log.warning("agent record %s ignored: %s", key, mismatch)
            self.state.set_agent(key, None)
            return
        self.state.set_agent(key, agent)

    async def _sagas(self) -> None:
        """The sagas as the coordinator publishes them (``pg_status``, schemas/status.py)."""
        kv = await self.bus.status_board()

        async def changed(key: str, value: bytes | None) -> None:
            if key.startswith("site."):  # the leading coordinator's policy figures
                site = saga_status.parse_site(key, value) if value else None
                if site is not None and (self.site is None or site.site == self.site.site):
                    self.state.reserve_s, self.state.budget_s = site.shutdown_reserve_s, site.ckpt_timeout_s
                return
            sid = key.removeprefix("saga.")
            status = saga_status.parse(key, value) if value else None
            if status is None:
                self.records.pop(sid, None)
            else:
                self.records[sid] = status

        await self._watch(kv.raw.watch(">"), changed, lambda: [f"saga.{sid}" for sid in self.records])

    async def _watch(
        self, starting, on_entry: Callable[[str, bytes | None], Awaitable[None]], known: Callable[[], list[str]]
    ) -> None:
        await watch_entries(starting, on_entry, known, stopped=lambda: self._stopped)

    def history(self, saga: str) -> list[dict[str, Any]]:
        """A saga's transitions, for its timeline picture (none when the record is not known)."""
        status = self.records.get(saga)
        return [{"state": h.state.value, "at": h.at, "reason": h.reason} for h in status.history] if status else []

    async def _summaries(self) -> None:
        """Every second: the sagas' rows from the records in memory (a countdown moves), and
        whether the bus is connected."""
        while not self._stopped:
            self.state.set_connected(self.bus.nc.is_connected)
            now = self.state.clock()
            rows = [status.row(now) for status in list(self.records.values())]
            self.state.set_sagas(rows)
            await asyncio.sleep(SAGA_POLL_S)


async def stop_tasks(tasks: list[asyncio.Task], *, wait_s: float, rounds: int = 3) -> list[asyncio.Task]:
    """Cancel ``tasks`` and wait ``wait_s`` for them, ``rounds`` times (a cancellation that a
    library call swallowed is repeated); returns those still running (none, normally)."""
    live = [t for t in tasks if not t.done()]
    for _ in range(rounds):
        if not live:
            return []
        for t in live:
            t.cancel()
        _, pending = await asyncio.wait(live, timeout=wait_s)
        live = list(pending)
    return live


async def watch_entries(
    starting,
    on_entry: Callable[[str, bytes | None], Awaitable[None]],
    known: Callable[[], list[str]],
    *,
    stopped: Callable[[], bool] = lambda: False,
) -> None:
    """Every entry of a KV watch (the current values first, then changes) to ``on_entry``
    (value None: deleted); once the current values are in, a key of ``known()`` that was not
    among them is deleted too (it went while the watch was down). Returns when the watch ends
    (or ``stopped()``)."""
    watcher = await starting
    seen: set[str] | None = set()
    try:
        async for entry in watcher:
            if stopped():
                return
            if entry is None:  # the current values have all been delivered
                if seen is not None:
                    for key in set(known()) - seen:
                        await on_entry(key, None)
                seen = None
                continue
            if seen is not None:
                seen.add(entry.key)
            gone = entry.operation in ("DEL", "PURGE") or not entry.value
            await on_entry(entry.key, None if gone else entry.value)
    finally:
        with contextlib.suppress(Exception):
            await watcher.stop()
