"""The coordinator service: events in, saga transitions stored with CAS, commands out.

Only the replica holding the lease consumes. Inputs arrive in batches on four durable
consumers: real power events on their own, a drill's readings on theirs, power-control's
results, and the jobs' acks and resumes (on the jobs' own stream). A real power batch goes first: no volume of
acks, junk included, ever queues in front of a power event (:class:`Gate`). Each batch is
applied to the sagas in memory, every changed saga is written to KV (CAS) *before* the
commands it implies are published, and only then is the batch acked. When a UPS's events
arrive older than ``max_event_age_s`` (a backlog), its newest reading is read from the stream
and applied: the saga acts on the UPS's current state, not on its queue. A replica that starts
(or takes over) loads the open sagas and re-sends what is pending.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Callable

from opentelemetry import context as otel_context

from powerguard.bus import Bus, CasConflict, ReadyLog, Received, ServiceContext
from powerguard.bus.roles import INPUT_BATCH, POWER_BATCH, durable_filters, durable_names
from powerguard.bus.tracing import parse_traceparent
from powerguard.schemas import (
    AgentData,
    AgentRegistered,
    CheckpointDurable,
    CheckpointFailed,
    CheckpointRecorded,
    ConfigError,
    Envelope,
    JobRestarted,
    JobResumed,
    NodeState,
    PowerActionFailed,
    PowerEvent,
    PowerGuardError,
    SiteConfig,
    UpsOutputResult,
    new_id,
)

from . import gauges, heap, metrics, saga
from .commands import pending
from .core import SiteCore, Step
from .gate import Gate
from .heap import Settler
from .inputs import Command
from .jobbook import JobBook, book_key
from .lease import Lease, LeaseKeeper
from .outbox import command_event, state_events
from .policy import Policy
from .record import SagaRecord
from .registry_feed import RegistryFeed
from .spans import emit_finished, root_context
from .status import StatusBoard
from .store import SagaStore
from .topology import AgentRegistry, Topology

log = logging.getLogger(__name__)

POWER_TYPES = (PowerEvent,)
RESULT_TYPES = (NodeState, PowerActionFailed, JobRestarted, UpsOutputResult)  # power-control's results
# the jobs' agents (their own stream): acks, resumes, and registrations for the book of known jobs
JOB_TYPES = (CheckpointDurable, CheckpointFailed, JobResumed, AgentRegistered)


async def _first_of(stopping: asyncio.Event, other: asyncio.Event | None, *, timeout_s: float) -> None:
    """Return when ``stopping`` or ``other`` is set, or after ``timeout_s``."""
    waits = [asyncio.ensure_future(e.wait()) for e in (stopping, other) if e is not None]
    try:
        await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()


class NotLeader(PowerGuardError):
    """This replica no longer holds the site's lease: it must not store or publish."""


class Coordinator:
    def __init__(self, bus: Bus, site: SiteConfig, *, policy: Policy | None = None, instance: str | None = None):
        self.bus = bus
        self.site = site
        self.topo = Topology.from_site(site)
        self.policy = policy or site.settings("coordinator", Policy)
        metrics.RESERVE.set(self.policy.shutdown_reserve_s)
        self.instance = instance or socket.gethostname()
        self.registry = AgentRegistry(ttl_s=bus.limits.agents_ttl_s)
        # the jobs the site knows, stored in the coordinator's own bucket (jobbook.py)
        self.book = JobBook(set(self.topo.feeds), forget_after_s=self.policy.forget_job_after_s)
        self._gauged_jobs: set[str] = set()
        self.core = SiteCore(self.topo, self.policy, registry=self.registry, book=self.book)
        self.revisions: dict[str, int] = {}  # open saga -> KV revision it was read or written at (0: new)
        self.leader = False
        self._gate = Gate()
        self._consumers: list = []
        self._agents = RegistryFeed(bus, self._on_agent)
        self._store: SagaStore | None = None
        self._status = StatusBoard(bus.status_board, self.policy, self.topo)  # what tools read (schemas/status.py)
        self._lease: Lease | None = None
        self._heap = Settler()  # the registry out of the GC's reach before an outage (heap.py)
        self._resend: set[str] = set()  # sagas whose last publish failed: re-send what is pending
        # sagas changed in memory but not yet stored: (record, first new history entry, commands)
        self._unsaved: dict[str, tuple[SagaRecord, int, list[Command]]] = {}

    @property
    def lease(self) -> Lease:
        """This replica's lease of the site (its key, holder and expiry; :meth:`Lease.lapse` is
        the test seam for a stall past it)."""
        assert self._lease is not None, "run() first"
        return self._lease

    @property
    def open(self) -> dict[str, SagaRecord]:
        return self.core.open

    # ------------------------------------------------------------------ lifecycle
    async def run(self, stopping: asyncio.Event, on_ready: Callable[[bool, str], None] | None = None) -> None:
        """Lead or follow the site's lease until ``stopping``; ``on_ready(ready, reason)`` after
        each lease check: ready while it holds or follows the lease, not while it cannot read it."""
        self._store = SagaStore(await self.bus.sagas())
        self._lease = Lease(
            await self.bus.leases(),
            key=f"coordinator.{self.site.site}",
            holder=self.instance,
            ttl_s=self.policy.lease_ttl_s,
        )
        log.info(
            "coordinator %s started for site %s (lease ttl %.1fs)",
            self.instance,
            self.site.site,
            self.policy.lease_ttl_s,
        )
        say = ReadyLog(f"coordinator {self.instance}", on_ready, where=f" for site {self.site.site}", logger=log)
        renew_every = self.policy.lease_ttl_s / 3
        # the lease is renewed beside the loop (lease.py); the loop must keep turning for it
        keeper = LeaseKeeper(self._lease, renew_every, stall_s=max(3 * self.policy.lease_ttl_s, 30.0))
        keeper.start()
        said_clash = None
        try:
            while not stopping.is_set():
                keeper.beat()
                if keeper.news.is_set():
                    held, exc = keeper.latest()
                    if exc is not None:
                        log.warning("lease check failed: %s", exc)
                        state = (False, f"cannot read or renew the lease in {self.bus.names.leases}: {exc!r}")
                    elif held:
                        state = (True, "ok: leads the site")
                    elif clash := self._lease.clash:
                        if clash != said_clash:
                            log.warning("%s does not lead site %s: %s", self.instance, self.site.site, clash)
                        state = (True, f"ok: standby: {clash}")
                    else:
                        state = (True, "ok: standby, another instance leads")
                    said_clash = self._lease.clash
                    if held and not self.leader:
                        try:
                            await self._lead()
                        except Exception as exc:  # the broker not ready for it: a cluster recovering from a cut
                            why = str(exc) or repr(exc)  # nats's errors say code and description in str()
                            metrics.TICK_ERRORS.inc()
                            log.error(
                                "%s could not start leading site %s (retried): %s", self.instance, self.site.site, why
                            )
                            await self._follow(f"could not start leading: {why}")
                            with contextlib.suppress(Exception):  # a replica that can may take it meanwhile
                                await self._lease.release()
                            state = (False, f"took the lease, cannot lead (gave it back; retrying): {why}")
                    elif not held and self.leader:
                        await self._follow("lease lost")
                    say(*state)
                self._job_gauges(time.time())  # every replica: a standby's /metrics says it too
                if self.leader:
                    try:
                        await self._store_book(time.time())
                    except Exception as exc:
                        log.error("known jobs not stored (retried at the next tick): %s", exc)
                    try:
                        await self._agents.check(time.time())  # a bucket the server lost: made and watched again
                    except Exception as exc:
                        log.error("agent registry bucket not checked (retried): %s", exc)
                    try:
                        await self.tick()
                    except Exception as exc:  # KV or broker trouble: the next tick retries, the process lives
                        metrics.TICK_ERRORS.inc()
                        log.error("tick failed (retried at the next tick): %s", exc)
                # a leader ticks; a standby waits for the next lease round
                await _first_of(
                    stopping,
                    None if self.leader else keeper.news,
                    timeout_s=self.policy.tick_s if self.leader else renew_every,
                )
        finally:
            await keeper.stop()
            if self.leader:
                await self._follow("stopping")
                await self._lease.release()

    async def _lead(self) -> None:
        log.info("%s leads site %s", self.instance, self.site.site)
        self.leader = True
        metrics.LEADER.set(1)
        await self._load_book()
        await self._agents.start(time.time())
        await self._status.site(self.site.site, self.instance, time.time())
        self._unsaved.clear()  # the store is the truth for a new leader
        loaded = await self._store.load(site=self.site.site, collect=True)  # ended ones teach the shutdowns
        self.revisions = {r.saga_id: rev for r, rev in loaded if not r.terminal}
        for rec, _ in loaded:
            self._battery_gauges(rec)
            if not rec.terminal:
                self._status.changed(rec)  # a new leader publishes what it took over
        for sid, again in self.core.resume(r for r, _ in loaded).items():
            rec = self.open[sid]
            log.info("resuming saga %s in state %s; re-sending %d command(s)", sid, rec.state, len(again))
            await self._publish(rec, again, resend=True)
        self._gauges()
        names = durable_names(self.site.site)
        filters = durable_filters(self.bus.names, self.site.site)
        for types, handler, durable, batch in (
            (POWER_TYPES, self.on_power, names["coordinator-power"], POWER_BATCH),
            (POWER_TYPES, self.on_drill_power, names["coordinator-drill"], POWER_BATCH),
            (RESULT_TYPES, self.on_batch, names["coordinator"], INPUT_BATCH),
            (JOB_TYPES, self.on_batch, names["coordinator-jobs"], INPUT_BATCH),
        ):
            self._consumers.append(
                await self.bus.consume_batches(
                    *types,
                    batch_handler=handler,
                    durable=durable,
                    subject=filters[durable],
                    batch=batch,
                    since_s=self.policy.max_event_age_s,
                    max_skew_s=self.policy.max_clock_skew_s,
                )
            )
        log.info(
            "consuming inputs for site %s (%d ranks known, %d open saga(s))",
            self.site.site,
            len(self.registry),
            len(self.open),
        )

    async def _follow(self, why: str) -> None:
        log.info("%s stops leading (%s)", self.instance, why)
        self.leader = False
        metrics.LEADER.set(0)
        consumers, self._consumers = self._consumers, []
        for consumer in consumers:
            await consumer.stop()
        await self._agents.stop()

    async def _load_book(self) -> None:
        """The jobs the site knew before this replica led (a restart, an upgrade, a failover)."""
        kv = self._store.kv
        prefix = book_key(self.site.site, "")
        stored = {}
        for key in await kv.keys():
            if key.startswith(prefix):
                entry = await kv.get(key)
                if entry is not None:
                    stored[key[len(prefix) :]] = entry.value
        self.book.load(stored)
        if self.book.jobs:
            log.info("known jobs of site %s: %s", self.site.site, ", ".join(sorted(self.book.jobs)))

    async def _store_book(self, now: float) -> None:
        """Store what changed in the book (each job's entry, fsynced by the server)."""
        for job in self.book.forget_silent(now):
            log.warning("job %s not heard for %.0fs (forget_job_after_s): forgotten", job, self.book.forget_after_s)
        save, gone = self.book.dirty()
        for known in save:
            try:
                await self._store.kv.put(book_key(self.site.site, known.job), known.encode())
            except Exception:
                self.book.mark(known.job)  # stored at the next tick
                raise
        for job in gone:
            await self._store.kv.delete(book_key(self.site.site, job))

    def _on_agent(self, agent: AgentData | None, key: str, seen_at: float, stored: bool) -> None:
        if agent is None:
            self.registry.remove_key(key)
            job = key.split(".", 1)[0]
            if job in self.book.jobs and not self.registry.agents(job):
                self.book.ended(job)  # its last rank deregistered: it ended
        else:
            self.book.heard(agent, time.time(), live=not stored)
            # the coordinator's own clock: the KV timestamp is the server's, and a skew between
            # the two would make every rank look expired (a saga without checkpoint requests).
            # Records stored before the watch started are not news of a live rank (after a
            # blackout they are the dead ranks' last words): only what is written since is heard
            self.registry.update(agent, time.time(), heard=not stored)

    # ------------------------------------------------------------------ inputs
    @property
    def consuming(self) -> bool:
        """Every consumer is bound (real power events; a drill's; power-control's results; the
        jobs' acks)."""
        return len(self._consumers) == 4

    async def on_power(self, items: list[Received]) -> None:
        """A batch of real power events, ahead of any other input."""
        async with self._gate.urgent():
            await self._power_batch(items)

    async def on_drill_power(self, items: list[Received]) -> None:
        """A batch of a drill's readings (the operator's subject, their own durable): never
        ahead of a real reading, however many the operator sends."""
        async with self._gate.normal():
            await self._power_batch(items)

    async def _power_batch(self, items: list[Received]) -> None:
        self._check_leader()
        step = self.core.apply(self._events(items), time.time())
        await self._commit(step)
        current = await self._current_readings(step)
        if current:
            await self._commit(self.core.apply(current, time.time()))

    async def on_batch(self, items: list[Received]) -> None:
        """A batch of results, or of acks and resumes."""
        async with self._gate.normal():
            self._check_leader()
            for item in items:
                ev = item.event
                if isinstance(ev, CheckpointDurable) and ev.data.durations.total_s is not None:
                    metrics.CHECKPOINT_SECONDS.labels(ev.data.job).observe(ev.data.durations.total_s)
                elif isinstance(ev, AgentRegistered):
                    # a rank's registration as an event (its job's own subject): the book hears the
                    # job even when the registry refused its record (its bucket full)
                    self.book.heard(ev.data, item.stored_at or time.time())
            await self._commit(self.core.apply(self._events(items), time.time()))
            if len(items) > 1 and self.open:  # a burst in an outage: what it left, out of the collector's walks
                heap.keep()

    def _check_leader(self) -> None:
        if not self.leader:
            raise NotLeader(f"{self.instance} does not lead site {self.site.site}")

    @staticmethod
    def _events(items: list[Received]) -> list[tuple[Envelope, tuple[str, str] | None, float | None]]:
        """Each event with its producer's trace and when JetStream stored it (its age's clock)."""
        return [(i.event, parse_traceparent(i.headers.get("traceparent")), i.stored_at) for i in items]

    async def _current_readings(self, step: Step) -> list[tuple[Envelope, tuple[str, str] | None, float | None]]:
        """A UPS whose events arrived too old to act on (they queued up): its newest reading on
        the stream, so the saga acts on what the UPS says now, never on its backlog alone."""
        out = []
        s = self.bus.subjects
        for drill, ups in sorted({(n.drill, n.ups) for n in step.notices if n.reason == "stale" and n.ups}):
            subject = s.drill_power(self.site.site, ups) if drill else s.power(self.site.site, ups)
            got = await self.bus.last(subject)
            if got is not None and isinstance(got.event, PowerEvent):
                log.warning("ups %s: events queued up; acting on its newest reading (%s)", ups, got.event.short_type)
                out.append((got.event, parse_traceparent(got.headers.get("traceparent")), got.stored_at))
        return out

    # ------------------------------------------------------------------ clock
    async def tick(self) -> None:
        async with self._gate.normal():
            if not self.leader:
                return
            await self._status.flush(time.time())  # what was held back (at most one a second per saga)
            if not (self.open or self._unsaved):
                took = self._heap.idle()
                if took is not None and took > 0.05:
                    log.debug("heap settled in %.3f s", took)
                return
            for sid in list(self._resend):
                if sid in self.open:
                    self._resend.discard(sid)
                    rec = self.open[sid]  # its newest state again (deduplicated by id), then its pending commands
                    newest = max(len(rec.history) - 1, 0)
                    await self._publish(rec, pending(rec, self.policy), newest, resend=True)
            await self._commit(self.core.tick(time.time()))

    # ------------------------------------------------------------------ output
    async def _commit(self, step: Step) -> None:
        """Store every changed record (CAS) before publishing what it implies. A record the
        store did not take is kept with its commands and stored first at the next call."""
        now = time.time()
        for notice in step.notices:
            metrics.IGNORED.labels(notice.reason).inc()
            if notice.reason in ("stale", "future") and not notice.drill:
                metrics.REAL_POWER_IGNORED.labels(notice.reason).inc()
            level = logging.WARNING if notice.reason in ("unknown_ups", "stale", "future") else logging.INFO
            log.log(level, "%s", notice.message)
        for sid in step.started:
            rec = next(r for r in step.changed if r.saga_id == sid)
            log.info("saga %s started: nodes at risk %s, jobs %s", sid, rec.at_risk, sorted(rec.jobs))
        if step.changed and not self._lease.held:
            # a stall (GC, a slow KV) outlived the lease: another replica may lead by now, so
            # nothing is stored or sent; the batch is redelivered to whoever leads
            await self._follow("lease expired while handling a batch")
            raise NotLeader(f"{self.instance}: lease for site {self.site.site} expired before publishing")
        todo = self._unsaved
        for rec in step.changed:
            sid = rec.saga_id
            if sid in todo:  # not stored last time: keep the older history start, add the commands
                todo[sid] = (rec, todo[sid][1], todo[sid][2] + step.commands.get(sid, []))
            else:
                todo[sid] = (rec, step.history_from.get(sid, 0), step.commands.get(sid, []))
        for sid, (rec, n_hist, cmds) in list(todo.items()):
            rec.spans_done |= emit_finished(self.bus.tracer, rec, now)  # stored: never exported twice
            try:
                rev = self.revisions.get(sid, 0)
                if rev == 0:
                    self.revisions[sid] = await self._store.create(rec)
                else:
                    self.revisions[sid] = await self._store.save(rec, rev)
            except CasConflict:
                log.error("saga %s was written by another coordinator: stepping down", sid)
                todo.clear()  # the new leader owns these sagas now
                await self._follow("saga written elsewhere")
                raise
            del todo[sid]
            for t in rec.history[n_hist:]:
                metrics.TRANSITIONS.labels(t.state.value).inc()
                log.info("saga %s -> %s (%s)", sid, t.state.value, t.reason)
            await self._publish(rec, cmds, state_from=n_hist)
            self._status.changed(rec)
            self._battery_gauges(rec)
            if rec.terminal:
                self.revisions.pop(sid, None)
        await self._status.flush(now)
        self._gauges()

    def _battery_gauges(self, rec: SagaRecord) -> None:
        gauges.battery(rec, self.core.shutdown_need(), lambda: saga.site_need_s(rec, self.core.topo, self.policy))

    def _job_gauges(self, now: float) -> None:
        self._gauged_jobs = gauges.jobs(self.book.health(self.registry.health(now)), self._gauged_jobs)

    def _gauges(self) -> None:
        gauges.sagas(self.open, self.site.site)

    async def _publish(
        self, rec: SagaRecord, cmds: list[Command], state_from: int | None = None, *, resend: bool = False
    ) -> None:
        """Publish state events, then commands (stored in the record first). The states go
        first: power-control checks a command against its saga's newest announced state (a
        UPS's output is cut only while the saga is ``down``), so a state is stored before any
        command it issued. A first publish that JetStream reports as a duplicate was squatted:
        alarm, and publish it again under a fresh id (receivers deduplicate by idempotency key)."""
        states: list[Envelope] = state_events(rec, state_from) if state_from is not None else []
        commands: list[Envelope] = [command_event(rec, c) for c in cmds]
        for c in cmds:
            metrics.COMMANDS.labels(c.kind).inc()
        if not states and not commands:
            return
        floors = await self.bus.floors() if any(isinstance(e, CheckpointRecorded) for e in commands) else None
        token = otel_context.attach(root_context(rec))
        try:
            sem = asyncio.Semaphore(128)

            async def one(ev: Envelope) -> None:
                async with sem:
                    if isinstance(ev, CheckpointRecorded):  # the floor in its own store first (no age limit)
                        await floors.put(ev.data.job, ev)
                    ack = await self.bus.publish(ev)
                    if ack.duplicate and not resend:
                        metrics.SQUATTED.inc()
                        log.error(
                            "saga %s: %s %s was already in the stream before the coordinator published it "
                            "(its id was squatted); publishing it again under a fresh id",
                            rec.saga_id,
                            ev.short_type,
                            ev.id,
                        )
                        await self.bus.publish(ev.model_copy(update={"id": new_id()}))

            failed: list[BaseException] = []
            what = "a state event"
            for ev in states:  # one at a time, in order: the newest state is the last one stored
                try:
                    await one(ev)
                except Exception as exc:
                    failed.append(exc)
                    break
            if not failed:  # else: no command goes out before its state (the next tick re-sends)
                results = await asyncio.gather(*(one(e) for e in commands), return_exceptions=True)
                failed = [r for r in results if isinstance(r, BaseException)]
                what = f"{len(failed)} of {len(commands)} commands"
        finally:
            otel_context.detach(token)
        if failed:
            # the record is stored; the next tick re-sends what is pending (receivers deduplicate)
            log.error(
                "saga %s: %s not stored (%s); re-sending on the next tick",
                rec.saga_id,
                what,
                failed[0],
            )
            self._resend.add(rec.saga_id)


async def main(ctx: ServiceContext) -> None:
    if ctx.site is None:
        raise ConfigError("the coordinator needs --config site.yaml (its topology and policy)")
    instance = getattr(ctx.args, "instance", None) if ctx.args else None
    heap.tune()  # a process of its own: its collector sized for batches of decoded acks
    coordinator = Coordinator(ctx.bus, ctx.site, instance=instance)
    await coordinator.run(ctx.stopping, on_ready=ctx.set_ready)
