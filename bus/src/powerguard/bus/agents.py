"""The live agent registry: every rank puts its :class:`AgentData` into the ``pg_agents`` KV
bucket (key ``<job>.<node>.<rank>``) when it registers and at every heartbeat; the bucket's TTL
drops ranks that stopped. A registration and a deregistration also go out as events (stored in
the jobs' stream, for observers); a heartbeat is the bucket's record only.

The bucket is soft state, kept in the servers' memory (replicated as the deployment's streams
are), never fsynced: at 100,000 ranks beating every 5 s a stored heartbeat would be 20,000 fsynced
writes a second. What an outage needs of it is copied into the saga's record when the outage
starts; a whole-site power cut loses it, and the ranks it described died with the power. A
single nats-server forgets a memory-stored bucket when it restarts: the coordinator creates it
again (:meth:`~powerguard.bus.client.Bus.ensure_agents`) and every live rank writes its record
at its next heartbeat.

The key is what the server lets the writer write: an agent credential allows
``<its job>.*.*``, one issued for a node (``powerguard creds issue agent --job J --node N``, held
by that node's leaf nats-server) only ``<J>.<N>.*``. A record is filed only as what its key says
(job, node and rank), so with node-bound credentials a rank's node is confirmed by the server.
A rank that moved to another node leaves its old key until the bucket's TTL: the newest put of a
(job, rank) wins, and a delete of a key that is no longer the rank's current one changes nothing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import nats.errors
from nats.js import errors as js_errors

from powerguard.schemas import (
    AgentData,
    AgentDeregistered,
    AgentEvent,
    AgentHeartbeat,
    AgentRegistered,
    IdentityMismatch,
    MalformedEvent,
)

from .errors import BusError, RegistrationRefused

if TYPE_CHECKING:
    from .client import Bus


def agent_key(job: str, node: str, rank: int) -> str:
    return f"{job}.{node}.{rank}"


def parse_agent_key(key: str) -> tuple[str, str, int] | None:
    """(job, node, rank) of a ``pg_agents`` key, or None for a key of another shape."""
    parts = key.split(".")
    if len(parts) != 3 or not parts[2].isdigit():
        return None
    return parts[0], parts[1], int(parts[2])


async def announce(bus: Bus, event: AgentEvent) -> None:
    """Register (or refresh, or with :class:`AgentDeregistered` remove) one rank. A record the
    registry refuses (its bucket full: the registry is shared by every job) goes out as a
    registration event on the job's own subject all the same, which the coordinator hears (its
    book of known jobs), then :class:`~powerguard.bus.errors.RegistrationRefused` says so."""
    key = agent_key(event.data.job, event.data.node, event.data.rank)
    try:
        agents = await bus.agents()
        if isinstance(event, AgentDeregistered):
            await agents.delete(key)
        else:
            await agents.put(key, event.data)
    except (nats.errors.Error, js_errors.Error, BusError, TimeoutError) as exc:
        if bus.nc.is_closed:
            raise
        as_event = event if not isinstance(event, AgentHeartbeat) else AgentRegistered(data=event.data)
        await bus.publish(as_event)
        raise RegistrationRefused(key, exc) from exc
    if not isinstance(event, AgentHeartbeat):
        await bus.publish(event)


def identity_mismatch(agent: AgentData, key: str) -> IdentityMismatch | None:
    """Why an agent record must not be filed under ``key`` (None: it may): its job, node and rank
    are the key's (the schema already bounds the world size and keeps the rank below it)."""
    if agent_key(agent.job, agent.node, agent.rank) != key:
        claim = f"job {agent.job!r} node {agent.node!r} rank {agent.rank}"
        return IdentityMismatch("agent record", key, key, claim)
    return None


class AgentWatch:
    """Follows the ``pg_agents`` bucket; calls ``on_change(agent, key, seen_at, stored)`` for every
    put and ``on_change(None, key, seen_at, stored)`` for a delete. ``ready`` is set once the
    initial values are in.

    ``stored``: this is the first record the watch hands over for its key, which may have been
    in the bucket before the watch started (the last word of a rank that may have died since,
    with the power); a later one for the same key was written while watching (a rank heard as it
    happened). Told by the order of the key's records, not by clocks, not by ``ready`` (nats-py
    may signal the end of the initial values before it has handed them all over) and not by the
    stream's last sequence read at start (one fault-campaign run after a power cut saw stored
    records counted as news that way). ``fresh``: the bucket is a new one (the server lost the
    last, see :meth:`~powerguard.bus.client.Bus.ensure_agents`), so everything in it was written
    since: no record is ``stored``."""

    def __init__(
        self, bus: Bus, on_change: Callable[[AgentData | None, str, float, bool], None], *, fresh: bool = False
    ) -> None:
        self.bus = bus
        self.on_change = on_change
        self.fresh = fresh
        self.ready = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._watcher = None
        self._current: dict[tuple[str, int], tuple[str, int]] = {}  # (job, rank) -> (key, revision)
        self._seen_keys: set[str] = set()  # keys the watch has handed over a record of

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
            parsed = parse_agent_key(entry.key)
            if entry.operation in ("DEL", "PURGE") or not entry.value:
                if parsed is not None and self._current.get((parsed[0], parsed[2]), (entry.key,))[0] == entry.key:
                    self._current.pop((parsed[0], parsed[2]), None)
                    self.on_change(None, entry.key, seen, self._first(entry.key))
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
            revision = entry.revision or 0
            key, newest = self._current.get((agent.job, agent.rank), (entry.key, -1))
            if key != entry.key and revision < newest:
                continue  # an older key of a rank that moved (a watch replays keys in key order)
            self._current[(agent.job, agent.rank)] = (entry.key, revision)
            self.on_change(agent, entry.key, seen, self._first(entry.key))

    def _first(self, key: str) -> bool:
        if self.fresh:
            return False
        first = key not in self._seen_keys
        self._seen_keys.add(key)
        return first

    async def stop(self) -> None:
        if self._watcher is not None:
            try:
                await self._watcher.stop()
            except Exception:
                pass
        if self._task is not None:
            self._task.cancel()
            self._task = None
