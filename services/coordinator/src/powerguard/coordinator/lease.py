"""Leader lease in the ``pg_leases`` KV bucket: one coordinator replica per site acts."""

from __future__ import annotations

import json
import logging
import time

from powerguard.bus import CasConflict, Kv

log = logging.getLogger(__name__)


class Lease:
    """``keep()`` acquires the lease when it is free or expired, renews it when held.

    The holder writes ``{"holder", "expires"}``; all writes are CAS on the revision, so two
    replicas can never both believe they hold it after the same round. A replica restarted
    under the same ``holder`` name takes its lease back at once."""

    def __init__(self, kv: Kv, *, key: str, holder: str, ttl_s: float) -> None:
        self.kv = kv
        self.key = key
        self.holder = holder
        self.ttl_s = ttl_s
        self.expires = 0.0

    def lapse(self) -> None:
        """Forget the lease here, as a stall past its TTL leaves it (a test seam: the fault
        campaigns and tests make a leader whose lease ran out mid-batch without waiting a TTL)."""
        self.expires = 0.0

    @property
    def held(self) -> bool:
        return time.time() < self.expires

    async def keep(self) -> bool:
        now = time.time()
        value = json.dumps({"holder": self.holder, "expires": now + self.ttl_s}).encode()
        try:
            entry = await self.kv.get(self.key)
            if entry is None:
                await self.kv.create(self.key, value)
            else:
                current = json.loads(entry.value)
                if current.get("holder") != self.holder and current.get("expires", 0) > now:
                    self.expires = 0.0
                    return False
                await self.kv.update(self.key, value, revision=entry.revision)
        except CasConflict:
            self.expires = 0.0
            return False
        except (ValueError, TypeError) as exc:
            log.error("lease %s unreadable (%s); overwriting", self.key, exc)
            await self.kv.put(self.key, value)
        self.expires = now + self.ttl_s
        return True

    async def release(self) -> None:
        if not self.held:
            return
        entry = await self.kv.get(self.key)
        if entry is not None and json.loads(entry.value).get("holder") == self.holder:
            try:
                await self.kv.update(
                    self.key, json.dumps({"holder": None, "expires": 0}).encode(), revision=entry.revision
                )
            except CasConflict:
                pass
        self.expires = 0.0
