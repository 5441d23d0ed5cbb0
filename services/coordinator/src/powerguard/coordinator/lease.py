"""Leader lease in the ``pg_leases`` KV bucket: one coordinator replica per site acts."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable

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


class LeaseKeeper:
    """Renews (or takes) a :class:`Lease` every ``every_s`` in a task of its own, so that a slow
    tick or a slow start as leader (a cluster's stores after a power cut answer in seconds) does
    not let the lease lapse while this replica lives and the broker answers.

    A replica whose own loop has stopped turning must still lose the site: the keeper renews only
    while the owner called :meth:`beat` within ``stall_s``. The owner reads each round's outcome
    with :meth:`latest` after :attr:`news` is set."""

    def __init__(
        self, lease: Lease, every_s: float, *, stall_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.lease = lease
        self.every_s = every_s
        self.stall_s = stall_s
        self.news = asyncio.Event()
        self._clock = clock
        self._beat = clock()
        self._seen: tuple[bool, Exception | None] = (False, None)
        self._task: asyncio.Task | None = None

    def beat(self) -> None:
        """The owner's loop turned (the keeper renews only while it does)."""
        self._beat = self._clock()

    def latest(self) -> tuple[bool, Exception | None]:
        """(held, the error of a round that could not read or write the lease), news cleared."""
        self.news.clear()
        return self._seen

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"lease {self.lease.key}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            started = self._clock()
            stalled = started - self._beat
            if stalled > self.stall_s:
                if self.lease.held:
                    log.error(
                        "lease %s left to lapse: this coordinator's loop has not turned for %.0fs",
                        self.lease.key,
                        stalled,
                    )
                self._seen = (False, None)
            else:
                try:
                    self._seen = (await self.lease.keep(), None)
                except Exception as exc:  # the broker did not answer: reported, tried again next round
                    self._seen = (False, exc)
                took = self._clock() - started
                if took > self.lease.ttl_s / 2:
                    log.warning(
                        "lease %s: one renewal took %.2fs of its %.1fs TTL (the broker's store is slow)",
                        self.lease.key,
                        took,
                        self.lease.ttl_s,
                    )
            self.news.set()
            await asyncio.sleep(max(0.0, self.every_s - (self._clock() - started)))
