"""Leader lease in the ``pg_leases`` KV bucket: one coordinator replica per site acts."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable

from powerguard.bus import CasConflict, Kv

log = logging.getLogger(__name__)


class Lease:
    """``keep()`` acquires the lease when it is free or expired, renews it when held.

    The holder writes ``{"holder", "token", "expires"}``; all writes are CAS on the revision, so
    two replicas can never both believe they hold it after the same round. ``token`` is drawn
    at each process's start: the lease is this process's, not its name's, so a second process
    under the same ``holder`` (two coordinators on one host without ``POWERGUARD_INSTANCE``)
    follows and says why (:attr:`clash`). A restart after a crash takes it at once when the
    holder was a process of this host that is gone (:meth:`_dead`); otherwise it waits out the
    TTL (a clean stop releases the lease, and the next start takes it at once)."""

    def __init__(self, kv: Kv, *, key: str, holder: str, ttl_s: float) -> None:
        self.kv = kv
        self.key = key
        self.holder = holder
        self.token = secrets.token_hex(8)
        self.host, self.boot, self.pid = socket.gethostname(), _boot_id(), os.getpid()
        self.ttl_s = ttl_s
        self.expires = 0.0
        self.clash: str | None = None  # why this process follows another of the same name

    def lapse(self) -> None:
        """Forget the lease here, as a stall past its TTL leaves it (a test seam: the fault
        campaigns and tests make a leader whose lease ran out mid-batch without waiting a TTL)."""
        self.expires = 0.0

    @property
    def held(self) -> bool:
        return time.time() < self.expires

    def _mine(self, current: dict) -> bool:
        return current.get("holder") == self.holder and current.get("token") == self.token

    def _dead(self, current: dict) -> bool:
        """The holder was a process of this host that is gone: of an earlier boot, or its pid no
        longer running (a crash and restart takes the lease back at once). Anything else, a
        live process or another host's, is waited out."""
        if current.get("host") != self.host or not isinstance(current.get("pid"), int):
            return False
        if current.get("boot") != self.boot:
            return True
        try:
            os.kill(current["pid"], 0)
        except ProcessLookupError:
            return True
        except OSError:  # it exists (another user's): alive
            return False
        return False

    async def keep(self) -> bool:
        now = time.time()
        mine = {"holder": self.holder, "token": self.token, "host": self.host, "boot": self.boot, "pid": self.pid}
        value = json.dumps({**mine, "expires": now + self.ttl_s}).encode()
        # ``clash`` is set once a round has its answer (the loop reads it between rounds)
        try:
            entry = await self.kv.get(self.key)
            if entry is None:
                await self.kv.create(self.key, value)
            else:
                current = json.loads(entry.value)
                if not self._mine(current) and current.get("expires", 0) > now and not self._dead(current):
                    self.clash = (
                        f"another coordinator process named {self.holder!r} holds the lease until it "
                        "lapses or is released (give each replica its own POWERGUARD_INSTANCE)"
                        if current.get("holder") == self.holder
                        else None
                    )
                    self.expires = 0.0
                    return False
                await self.kv.update(self.key, value, revision=entry.revision)
        except CasConflict:
            self.expires, self.clash = 0.0, None
            return False
        except (ValueError, TypeError, AttributeError) as exc:
            log.error("lease %s unreadable (%s); overwriting", self.key, exc)
            await self.kv.put(self.key, value)
        self.expires, self.clash = now + self.ttl_s, None
        return True

    async def release(self) -> None:
        if not self.held:
            return
        entry = await self.kv.get(self.key)
        if entry is not None and self._mine(json.loads(entry.value)):
            try:
                await self.kv.update(
                    self.key, json.dumps({"holder": None, "expires": 0}).encode(), revision=entry.revision
                )
            except CasConflict:
                pass
        self.expires = 0.0


def _boot_id() -> str | None:
    """This host's boot (Linux): a lease held in an earlier boot is held by no process now."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return None


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
