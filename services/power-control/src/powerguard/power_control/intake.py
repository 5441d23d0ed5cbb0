"""A command's way in: whether power-control runs it (admission.py's pure rule over the state
its saga was last announced in) and, once admitted, its claim in the ``pg_power`` ledger
(exactly once per idempotency key). Returns what to run; runs nothing itself."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from powerguard.bus import Bus, ReadError
from powerguard.schemas import Envelope, JobRestartRequested, JobStopRequested, SagaStateChanged

from .admission import NO_SAGA, may_be_stale, refusal
from .config import PowerControlSettings
from .ledger import Ledger
from .ups_output import UpsOutputs

log = logging.getLogger("powerguard.power_control.service")
REREAD_S = (0.1, 0.3, 0.6)  # a saga-state refusal is read again after these pauses before it stands


@dataclass(frozen=True)
class Admitted:
    """A command to run, under its idempotency key."""

    event: Envelope
    key: str


@dataclass(frozen=True)
class Refused:
    event: Envelope
    why: str


class Intake:
    def __init__(
        self, bus: Bus, settings: PowerControlSettings, *, nodes: set[str], ups: UpsOutputs, ledger: Ledger
    ) -> None:
        self.bus, self.settings, self.nodes, self.ups, self.ledger = bus, settings, nodes, ups, ledger

    async def take(self, event: Envelope) -> Admitted | Refused | None:
        """The command admitted and claimed, refused (with why), or None (nothing to do: a
        duplicate, or a job command of no saga)."""
        d = event.data
        if isinstance(event, JobStopRequested | JobRestartRequested) and d.saga_id is None:
            log.info("ignoring %s for job %s without a saga id", event.short_type, d.job)
            return None
        why = await self.refusal(event)
        if why is not None:
            return Refused(event, why)
        key = d.idempotency_key or f"{event.type}/{event.id}"
        if await self.ledger.claim(key, event.model_dump(mode="json")) is None:
            seen = await self.ledger.get(key) or {}
            log.info("duplicate command %s (%s): nothing new done", key, seen.get("status", "?"))
            return None
        return Admitted(event, key)

    async def refusal(self, event: Envelope) -> str | None:
        """Why this command must not run (None: run it): admission.py's rule over the state
        its saga was last announced in (a direct get of the newest ``pg.saga.<id>`` event).

        In a cluster the read may be answered by a replica a moment behind the leader: an
        older state, or none yet, for a command the coordinator sent after announcing its
        state. So a refusal that such a lag can explain (:func:`.admission.may_be_stale`) is
        read again (:data:`REREAD_S`) before it stands, and a read that keeps failing raises
        (the command is delivered again): "not read" is never taken for "never announced".
        Any other refusal stands at once (it never holds the consumer)."""
        if why := self.admit(event, None):  # too old, not in the site file: no read changes that
            return why
        if not self.settings.require_saga:
            return None
        saga_id = event.data.saga_id
        if not saga_id:
            return self.admit(event, NO_SAGA)
        subject = self.bus.subjects.saga(saga_id)
        why, failure = None, None
        for pause in (*REREAD_S, None):
            try:
                got = await self.bus.last(subject, strict=True)
                failure = None
            except ReadError as exc:
                failure = exc
            else:
                ok = got is not None and isinstance(got.event, SagaStateChanged) and got.event.data.saga_id == saga_id
                state = got.event.data.state if ok else NO_SAGA
                why = self.admit(event, state)
                if why is None or not may_be_stale(event, state):
                    return why
            if pause is not None:
                await asyncio.sleep(pause)
        if failure is not None:
            raise failure
        return why

    def admit(self, event: Envelope, saga: str | None) -> str | None:
        return refusal(
            event,
            now=time.time(),
            max_age_s=self.settings.max_command_age_s,
            nodes=self.nodes,
            ups=self.ups,
            saga=saga,
        )
