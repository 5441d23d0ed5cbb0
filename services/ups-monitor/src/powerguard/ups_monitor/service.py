"""The ups-monitor service: poll every UPS concurrently (bounded), run each through its state
machine, and publish power events. Power transitions are claimed by CAS on the ``pg_ups`` KV
bucket (``<site>.<ups>``), and their event ids derive from the claimed sequence number, so two
monitors watching one UPS put one event per transition on the stream.

A transition whose publish failed (the server did not store it in time) is published again,
the same event (same id: the stream keeps one), before anything else of its UPS at every
poll until the server has stored it; and the UPS's current state is re-asserted at once (a
status event at the next good reading), so the coordinator acts on what the UPS says now."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import nats.errors

from powerguard.bus import Bus, BusError, CasConflict, ReadyLog, ServiceContext
from powerguard.schemas import (
    CommLost,
    CommRestored,
    ConfigError,
    Envelope,
    ForcedShutdown,
    LowBattery,
    OnBattery,
    OnLine,
    Overload,
    PowerData,
    PowerStatus,
    ReplaceBattery,
    SiteConfig,
    UpsConfig,
    deterministic_id,
    secret_value,
)

from . import clock, metrics
from .config import MonitorSettings, SnmpOptions
from .drivers import make_driver
from .nut import UpsError
from .readiness import Readiness
from .reading import Reading
from .state import POWER_KINDS, Transition, UpsState

log = logging.getLogger(__name__)
CLOCK_PROBE_EVERY_S = 60.0  # the server's clock against this host's (clock.py)
CLOCK_OFFSET_WARN_S = 30.0  # logged as an error past this (the alert's bound too)

EVENTS = {
    "on_battery": OnBattery,
    "on_line": OnLine,
    "low_battery": LowBattery,
    "fsd": ForcedShutdown,
    "replace_battery": ReplaceBattery,
    "overload": Overload,
    "comm_lost": CommLost,
    "comm_restored": CommRestored,
    "status": PowerStatus,
}
FLAGS = ("on_battery", "low_battery", "fsd", "replace_battery", "overload")
UNSENT_MAX = 64  # transitions of one UPS kept for publishing again (the oldest dropped first)


@dataclass
class Target:
    cfg: UpsConfig
    driver: Any
    state: UpsState
    comm_seq: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # a trap's poll and the periodic one
    trap_poll: asyncio.Task | None = None
    unsent: list[Envelope] = field(default_factory=list)  # power transitions the server has not stored yet


class RateLimiter:
    """A token bucket per key (burst ``2 x rate``), clock injected."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self._buckets: dict[str, tuple[float, float]] = {}

    def allow(self, key: str, now: float) -> bool:
        burst = max(1.0, 2 * self.rate)
        tokens, last = self._buckets.get(key, (burst, now))
        tokens = min(burst, tokens + (now - last) * self.rate)
        if len(self._buckets) > 4096:
            self._buckets.clear()  # bounded: a flood from spoofed senders cannot grow it
        if tokens < 1.0:
            self._buckets[key] = (tokens, now)
            return False
        self._buckets[key] = (tokens - 1.0, now)
        return True


class Monitor:
    def __init__(
        self, bus: Bus, site: SiteConfig, *, settings: MonitorSettings | None = None, instance: str | None = None
    ) -> None:
        self.bus, self.site = bus, site
        self._bus_errors: dict[str, str] = {}  # ups -> the bus failure last said (said once per change)
        self.settings = settings or site.settings("ups_monitor", MonitorSettings)
        self.instance = instance or socket.gethostname()
        self.targets: list[Target] = []
        self.unwatched: dict[str, str] = {}  # UPS -> why it cannot be watched (the others still are)
        now = time.time()
        for cfg in site.ups:
            try:
                driver = make_driver(cfg, self.settings)
            except ConfigError as exc:
                log.error("ups %s cannot be watched: %s", cfg.name, exc)
                self.unwatched[cfg.name] = str(exc)
                metrics.UNWATCHED.labels(site.site, cfg.name).set(1)
                continue
            self.targets.append(
                Target(
                    cfg,
                    driver,
                    UpsState(
                        comm_timeout_s=self.settings.comm_timeout_s,
                        status_every_s=self.settings.status_every_s,
                        started_at=now,
                    ),
                )
            )
        self.readiness = Readiness(tuple(c.name for c in site.ups), dict(self.unwatched))
        self._sem = asyncio.Semaphore(self.settings.max_concurrent_polls)
        self.traps = None
        self._trap_tasks: set[asyncio.Task] = set()
        self._trap_limiter = RateLimiter(self.settings.trap_rate_per_s)
        self._id_secret: str | None = None

    async def start_traps(self) -> None:
        """Listen for SNMP traps when ``trap_port`` is set; a trap polls its UPS at once."""
        if self.settings.trap_port is None:
            return
        from .traps import TrapReceiver, V3TrapUser

        if not self.settings.trap_host:
            raise ConfigError("ups_monitor.trap_host: set the address to receive traps on (e.g. the management NIC)")
        community = secret_value(self.settings.trap_community)
        users = []
        for t in self.targets:
            o = t.cfg.options
            if t.cfg.driver == "snmp" and o.get("version") == "3" and o.get("trap_engine_id"):
                opts = SnmpOptions.model_validate(o)
                users.append(
                    V3TrapUser(opts.user, secret_value(opts.auth_key), secret_value(opts.priv_key), o["trap_engine_id"])
                )
        self.traps = TrapReceiver(
            host=self.settings.trap_host,
            port=self.settings.trap_port,
            community=community,
            v3_users=users,
            on_trap=self._on_trap,
        )
        await self.traps.start()

    def _on_trap(self, trap) -> None:
        """A trap is a claim, not a fact: it makes the monitor poll its UPS at once (at most one
        trap poll in flight per UPS, and ``trap_rate_per_s`` per sender); only what the poll
        reads becomes an event."""
        hit = [t for t in self.targets if t.cfg.host == trap.source]
        if not hit:
            metrics.TRAPS_DROPPED.labels("unknown_sender").inc()
            log.warning("trap %s from %s, which is no configured UPS: ignored", trap.trap_oid, trap.source)
            return
        if not self._trap_limiter.allow(trap.source, time.monotonic()):
            metrics.TRAPS_DROPPED.labels("rate").inc()
            log.warning("trap %s from %s dropped: over %.1f/s", trap.trap_oid, trap.source, self._trap_limiter.rate)
            return
        for t in hit:
            if t.trap_poll is not None and not t.trap_poll.done():
                continue  # a trap poll of this UPS is already under way: it reads the same state
            t.trap_poll = asyncio.create_task(self.poll(t, trap=trap))
            self._trap_tasks.add(t.trap_poll)
            t.trap_poll.add_done_callback(self._trap_tasks.discard)

    async def _event_id_secret(self) -> str:
        """The key of this site's power-event ids, shared by its monitors through ``pg_ups``
        (which only ups-monitor may read): an id nobody else can compute cannot be squatted."""
        kv = await self.bus.ups_states()
        key = f"{self.site.site}._secret"
        for _ in range(3):
            entry = await kv.get(key)
            if entry is not None:
                return entry.json()["secret"]
            try:
                await kv.create(key, {"secret": secrets.token_hex(16)})
            except CasConflict:
                continue  # another monitor made it first
        raise ConfigError(f"cannot read or create the event-id secret {key} in {kv.bucket}")

    async def run(self, stopping: asyncio.Event, after_poll: Callable[[Readiness], None] | None = None) -> None:
        """Poll every UPS each interval until ``stopping``; ``after_poll`` sees the readiness after
        each round."""
        await self.start_traps()
        interval = self.settings.poll_interval_s
        probed = -math.inf
        while not stopping.is_set():
            started = time.monotonic()
            if started - probed >= CLOCK_PROBE_EVERY_S:
                probed = started
                await self._probe_clock()
            await asyncio.gather(*(self.poll(t) for t in self.targets), return_exceptions=True)
            if after_poll is not None:
                after_poll(self.readiness)
            try:
                await asyncio.wait_for(stopping.wait(), max(0.0, interval - (time.monotonic() - started)))
            except TimeoutError:
                pass
        if self.traps is not None:
            self.traps.close()
        for t in self.targets:
            await t.driver.close()

    async def _probe_clock(self) -> None:
        """The server's clock against this host's (clock.py), exported; a large offset logged."""
        try:
            off = await clock.probe(self.bus, self.site.site)
        except Exception as exc:  # the broker away: the next probe tries again
            log.debug("clock probe failed: %s", exc)
            return
        metrics.CLOCK_OFFSET.labels(self.site.site).set(off.seconds)
        metrics.CLOCK_OFFSET_ERROR.labels(self.site.site).set(off.error_s)
        if abs(off.seconds) > CLOCK_OFFSET_WARN_S:
            log.error(
                "this host's clock is %.1f s %s the NATS server's (±%.3f s): fix its time sync (chrony, NTP)",
                abs(off.seconds),
                "behind" if off.seconds > 0 else "ahead of",
                off.error_s,
            )

    async def poll(self, t: Target, trap=None) -> None:
        """Poll one UPS; nothing this UPS does (no answer, garbage, a driver bug) reaches the
        others: it becomes a partial reading or comm_lost of this UPS."""
        try:
            await self._poll(t, trap)
        except (TimeoutError, BusError, nats.errors.Error) as exc:  # the bus: one line, when it changes
            metrics.POLL_ERRORS.labels(self.site.site, t.cfg.name).inc()
            why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            self.readiness.publish_failed(f"the bus did not take this UPS's state: {why}")
            if self._bus_errors.get(t.cfg.name) != why:
                self._bus_errors[t.cfg.name] = why
                log.error(
                    "ups %s: the bus did not take its state (%s): is this ups-monitor's own credential, and was "
                    "`powerguard bootstrap` run?",
                    t.cfg.name,
                    why,
                )
        except Exception as exc:  # a bug or a failure outside the driver: this UPS only
            metrics.POLL_ERRORS.labels(self.site.site, t.cfg.name).inc()
            log.exception("ups %s: poll failed unexpectedly: %s", t.cfg.name, exc)
        else:
            self._bus_errors.pop(t.cfg.name, None)

    async def _poll(self, t: Target, trap=None) -> None:
        async with t.lock, self._sem:
            if t.unsent:
                await self._resend(t)  # first: what the UPS said before what it says now
            now = time.time()
            try:
                reading = (await asyncio.wait_for(t.driver.poll(), self.settings.timeout_s)).checked()
            except (UpsError, TimeoutError, ValueError, TypeError, KeyError, IndexError, OSError) as exc:
                error = str(exc) or f"no answer within {self.settings.timeout_s:g}s"
                if not isinstance(exc, UpsError | TimeoutError):
                    error = f"unreadable answer: {type(exc).__name__}: {exc}"[:300]
                if t.state.last_error != error:
                    log.warning("ups %s: %s", t.cfg.name, error)
                if trap is not None:
                    log.warning(
                        "ups %s: trap %s (%s) not confirmed: the poll after it failed; no event from a trap alone",
                        t.cfg.name,
                        trap.trap_oid,
                        trap.meaning,
                    )
                reading = None
                self.readiness.unreadable(t.cfg.name, error)
                transitions = t.state.failed(error, now)
                if any(tr.kind == "comm_lost" for tr in transitions):
                    metrics.comm_lost(self.site.site, t.cfg.name)
            if reading is not None:
                self.readiness.read(t.cfg.name)
                metrics.observe(self.site.site, t.cfg.name, reading)
                previous = t.state.reading
                transitions = t.state.good(reading, now)
                if any(getattr(reading, f) != (getattr(previous, f) if previous else False) for f in FLAGS):
                    transitions = await self._claim(t, reading, transitions)
        for tr in transitions:
            await self._emit(t, tr, now, via="trap" if trap is not None else "poll")

    def _publish_failed(self, t: Target, transition: Envelope | None, exc: BaseException) -> None:
        """A publish the server did not store: a power transition is kept to be published again,
        and the UPS's state is re-asserted (a status at the next good reading)."""
        if transition is not None and all(e.id != transition.id for e in t.unsent):
            t.unsent.append(transition)
            del t.unsent[:-UNSENT_MAX]
        t.state.last_status_at = None
        self.readiness.publish_failed(str(exc) or type(exc).__name__)
        metrics.PUBLISH_OK.labels(self.site.site).set(0)

    def _published(self) -> None:
        self.readiness.published()
        metrics.PUBLISH_OK.labels(self.site.site).set(1)

    async def _resend(self, t: Target) -> bool:
        """Publish this UPS's unsent transitions again, oldest first; True once all are stored."""
        while t.unsent:
            event = t.unsent[0]
            try:
                await self.bus.publish(event)
            except Exception as exc:
                log.error("ups %s: %s still not published: %s", t.cfg.name, event.short_type, exc)
                self._publish_failed(t, None, exc)
                return False
            t.unsent.pop(0)
            log.warning("ups %s: %s published (again) after a failed publish", t.cfg.name, event.short_type)
            self._published()
        return True

    async def _claim(self, t: Target, reading: Reading, transitions: list[Transition]) -> list[Transition]:
        """Record the new flags in KV by CAS; keep only the power transitions no other monitor
        published already, each tagged with its sequence number."""
        kv = await self.bus.ups_states()
        key = f"{self.site.site}.{t.cfg.name}"
        flags = {f: getattr(reading, f) for f in FLAGS}
        for _ in range(10):
            entry = await kv.get(key)
            old = entry.json() if entry else {"flags": {f: False for f in FLAGS}, "seq": 0}
            fresh = [tr for tr in transitions if tr.kind not in POWER_KINDS or _new(tr.kind, old["flags"], flags)]
            if old["flags"] == flags:
                return fresh
            value = {"flags": flags, "seq": old["seq"] + 1, "by": self.instance, "at": time.time()}
            try:
                if entry is None:
                    await kv.create(key, value)
                else:
                    await kv.update(key, value, revision=entry.revision)
            except CasConflict:
                continue
            return [
                Transition(tr.kind, tr.reading, f"seq {value['seq']}") if tr.kind in POWER_KINDS else tr for tr in fresh
            ]
        log.error("ups %s: could not record its state in KV (contention); publishing anyway", t.cfg.name)
        return transitions

    async def _emit(self, t: Target, tr: Transition, now: float, via: str = "poll") -> None:
        site, ups = self.site.site, t.cfg.name
        if self._id_secret is None:
            try:
                self._id_secret = await self._event_id_secret()
            except Exception as exc:  # its KV bucket refused or missing: nothing can be published
                self.readiness.publish_failed(f"cannot read the event-id secret in {self.bus.names.ups}: {exc!r}")
                metrics.PUBLISH_OK.labels(site).set(0)
                raise
        key = self._id_secret
        if tr.kind in POWER_KINDS:
            eid = deterministic_id(site, ups, tr.kind, tr.reason or now, secret=key)
        elif tr.kind == "status":
            eid = deterministic_id(site, ups, "status", int(now // self.settings.status_every_s), secret=key)
        else:
            t.comm_seq += 1
            eid = deterministic_id(site, ups, tr.kind, self.instance, t.comm_seq, int(now), secret=key)
        r = tr.reading
        data = PowerData(
            site=site,
            ups=ups,
            on_battery=r.on_battery if r else False,
            status=list(r.status) if r else [],
            charge_pct=r.charge_pct if r else None,
            runtime_s=r.runtime_s if r else None,
            load_pct=r.load_pct if r else None,
            input_v=r.input_v if r else None,
            seconds_on_battery=r.seconds_on_battery if r else None,
            driver=t.cfg.driver,
            via=via,
            partial=bool(r and r.partial) or r is None,
            reason=tr.reason if tr.kind in ("comm_lost", "comm_restored") else None,
            observed_at=datetime.fromtimestamp(now, UTC),
        )
        event = EVENTS[tr.kind](id=eid, source=f"/powerguard/ups-monitor/{self.instance}", subject=ups, data=data)
        if t.unsent:  # older transitions are not stored yet: nothing of this UPS overtakes them
            if tr.kind in POWER_KINDS:
                t.unsent.append(event)
            t.state.last_status_at = None
            return
        # a state change starts the outage trace: from the moment it was seen to the event stored
        detect = (
            self.bus.tracer.start_as_current_span(
                f"detect {ups}",
                start_time=int(now * 1e9),
                attributes={
                    "powerguard.site": site,
                    "powerguard.ups": ups,
                    "powerguard.transition": tr.kind,
                    "powerguard.via": via,
                    "powerguard.driver": t.cfg.driver,
                },
            )
            if tr.kind != "status"
            else contextlib.nullcontext()
        )
        with detect:
            try:
                await self.bus.publish(event)
            except Exception as exc:
                log.error("ups %s: %s not published: %s", ups, tr.kind, exc)
                self._publish_failed(t, event if tr.kind in POWER_KINDS else None, exc)
                return
        self._published()
        if tr.kind != "status":
            metrics.TRANSITIONS.labels(site, ups, tr.kind).inc()
            log.info("ups %s: %s", ups, tr.kind)


def _new(kind: str, old: dict[str, bool], new: dict[str, bool]) -> bool:
    if kind in ("on_battery", "on_line"):
        return old.get("on_battery", False) != new["on_battery"]
    return new.get(kind, False) and not old.get(kind, False)


async def main(ctx: ServiceContext) -> None:
    if ctx.site is None:
        raise ConfigError("the ups-monitor needs --config site.yaml (its UPSes)")
    monitor = Monitor(ctx.bus, ctx.site)
    # ready once every UPS was read and the server stored what this credential published; /readyz
    # says what is missing (a UPS that cannot be watched or read, events the server refuses)
    ctx.set_ready(False, monitor.readiness.verdict()[1])
    say = ReadyLog("ups-monitor", ctx.set_ready, logger=log)

    def after_poll(readiness: Readiness) -> None:
        say(*readiness.verdict())

    log.info("ups-monitor: %d UPS(es), poll every %.1fs", len(monitor.targets), monitor.settings.poll_interval_s)
    await monitor.run(ctx.stopping, after_poll)
