"""Saga records in the ``pg_sagas`` KV bucket, written with CAS on the revision."""

from __future__ import annotations

import logging

from powerguard.bus import BusNames, Kv

from .saga import SagaRecord

log = logging.getLogger(__name__)
saga_key = BusNames.saga_key


class SagaStore:
    def __init__(self, kv: Kv) -> None:
        self.kv = kv

    async def load(self, *, site: str | None = None, open_only: bool = False) -> list[tuple[SagaRecord, int]]:
        out = []
        for entry in await self.kv.items():
            if not entry.key.startswith("saga."):
                continue
            try:
                rec = SagaRecord.model_validate_json(entry.value)
            except ValueError as exc:
                log.error("unreadable saga record %s skipped: %s", entry.key, exc)
                continue
            if (site is None or rec.site == site) and not (open_only and rec.terminal):
                out.append((rec, entry.revision))
        return sorted(out, key=lambda item: item[0].created_at)

    async def create(self, rec: SagaRecord) -> int:
        return await self.kv.create(saga_key(rec.saga_id), rec.model_dump_json().encode())

    async def save(self, rec: SagaRecord, revision: int) -> int:
        """CAS write; raises :class:`~powerguard.bus.CasConflict` when someone else wrote."""
        return await self.kv.update(saga_key(rec.saga_id), rec.model_dump_json().encode(), revision=revision)
