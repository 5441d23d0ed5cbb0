"""The live agent registry: every rank puts its :class:`AgentData` into the ``pg_agents`` KV
bucket (key ``<job>.<rank>``) when it registers and at every heartbeat; the bucket's TTL
drops ranks that stopped. The same data also goes out as an event for observers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from powerguard.schemas import AgentData, AgentDeregistered, AgentEvent, IdentityMismatch, MalformedEvent

if TYPE_CHECKING:
    from .client import Bus


def agent_key(job: str, rank: int) -> str:
    return f"{job}.{rank}"


async def announce(bus: Bus, event: AgentEvent) -> None:
    """Register (or refresh, or with :class:`AgentDeregistered` remove) one rank."""
    agents = await bus.agents()
    key = agent_key(event.data.job, event.data.rank)
    if isinstance(event, AgentDeregistered):
        await agents.delete(key)
    else:
        await agents.put(key, event.data)
    await bus.publish(event)


def identity_mismatch(agent: AgentData, key: str) -> IdentityMismatch | None:
    """Why an agent record must not be filed under ``key`` (None: it may): its job and rank are
    the key's (the schema already bounds the world size and keeps the rank below it)."""
    if agent_key(agent.job, agent.rank) != key:
        return IdentityMismatch("agent record", key, key, f"job {agent.job!r} rank {agent.rank}")
    return None


class AgentWatch:
    """Follows the ``pg_agents`` bucket; calls ``on_change(agent, seen_at)`` for every put and
    ``on_change(None, key)`` for a delete. ``ready`` is set once the initial values are in."""

    def __init__(self, bus: Bus, on_change: Callable[[AgentData | None, str, float], None]) -> None:
        self.bus = bus
        self.on_change = on_change
        self.ready = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._watcher = None

    async def start(self) -> None:
        kv = await self.bus.agents()
        self._watcher = await kv.raw.watchall()
        self._task = asyncio.create_task(self._run(), name="agent-watch")

    async def _run(self) -> None:
        assert self._watcher is not None
        async for entry in self._watcher:
            if entry is None:  # end of the initial values
                self.ready.set()
                continue
            seen = entry.created.timestamp() if entry.created else time.time()
            if entry.operation in ("DEL", "PURGE") or not entry.value:
                self.on_change(None, entry.key, seen)
                continue
            subject = f"$KV.{self.bus.names.agents}.{entry.key}"
            try:
                agent = AgentData.model_validate_json(entry.value)
            except ValueError as exc:
                await self.bus.dead_letter(
                    subject=subject, payload=entry.value, error=MalformedEvent(f"bad agent record: {exc}")
                )
                continue
            mismatch = identity_mismatch(agent, entry.key)
            if mismatch is not None:
                # the server bound the key to the writer's job; what the record says inside is
                # only the writer's word: another job's name or rank is refused, never filed
                await self.bus.dead_letter(subject=subject, payload=entry.value, error=mismatch)
                continue
            self.on_change(agent, entry.key, seen)

    async def stop(self) -> None:
        if self._watcher is not None:
            try:
                await self._watcher.stop()
            except Exception:
                pass
        if self._task is not None:
            self._task.cancel()
            self._task = None
