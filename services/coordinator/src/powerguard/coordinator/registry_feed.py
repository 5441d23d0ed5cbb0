"""The leader's feed of the agent registry: a watch of the ``pg_agents`` bucket, started again
when the bucket is a new one.

The bucket is memory-stored soft state (bus/agents.py): a single nats-server that restarts
forgets it, and a watch of the bucket it lost receives nothing more. So every ``check_every_s``
the leader asks the server for the bucket (:meth:`~powerguard.bus.client.Bus.ensure_agents`,
which creates it when it is missing) and compares its incarnation with the one the watch
follows: a new one gets a new watch, whose every record is a rank heard (it was written since
the loss; the ranks write theirs again at their next heartbeat). The watch the leader starts
with may hold the last words of ranks that died with the power: its first record of each key
is not news (:class:`~powerguard.bus.agents.AgentWatch`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from powerguard.bus import Bus
from powerguard.bus.agents import AgentWatch
from powerguard.schemas import AgentData

log = logging.getLogger("powerguard.coordinator")

OnAgent = Callable[[AgentData | None, str, float, bool], None]


class RegistryFeed:
    def __init__(self, bus: Bus, on_change: OnAgent, *, check_every_s: float = 5.0) -> None:
        self.bus = bus
        self.on_change = on_change
        self.check_every_s = check_every_s
        self._watch: AgentWatch | None = None
        self._incarnation: str | None = None
        self._checked_at = float("-inf")

    async def start(self, now: float, *, ready_within_s: float = 10.0) -> None:
        """Watch the bucket as it is (created if missing) and wait for its stored records."""
        self._incarnation, created = await self.bus.ensure_agents()
        if created:
            log.warning("agent registry bucket %s was missing: created it", self.bus.names.agents)
        self._checked_at = now
        # a local name: a lost lease may stop the feed (``stop``) while this waits
        self._watch = watch = AgentWatch(self.bus, self.on_change, fresh=created)
        await watch.start()
        try:
            await asyncio.wait_for(watch.ready.wait(), ready_within_s)
        except TimeoutError:
            log.warning("agent registry not fully loaded after %gs; continuing", ready_within_s)

    async def check(self, now: float) -> bool:
        """At most every ``check_every_s``: a bucket the server lost is created again and watched
        anew (True when the watch was replaced)."""
        if self._watch is None or now - self._checked_at < self.check_every_s:
            return False
        self._checked_at = now
        incarnation, created = await self.bus.ensure_agents()
        if incarnation == self._incarnation:
            return False
        log.warning(
            "agent registry bucket %s is a new one (%s; the server lost the last: a restarted single server "
            "forgets a memory-stored bucket): watching it, ranks are heard again at their next heartbeat",
            self.bus.names.agents,
            "created it" if created else "created elsewhere",
        )
        await self._watch.stop()
        self._incarnation = incarnation
        self._watch = AgentWatch(self.bus, self.on_change, fresh=True)
        await self._watch.start()
        return True

    async def stop(self) -> None:
        if self._watch is not None:
            await self._watch.stop()
            self._watch = None
