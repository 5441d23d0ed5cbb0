"""The coordinator service: events in, saga transitions stored with CAS, commands out.

Only the replica holding the lease consumes. Inputs arrive in batches on one durable
consumer; each batch is applied to the sagas in memory, every changed saga is written to
KV (CAS) *before* the commands it implies are published, and only then is the batch acked.
A replica that starts (or takes over) loads the open sagas and re-sends what is pending.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import socket
import time
from datetime import UTC, datetime

from opentelemetry import context as otel_context

from powerguard.bus import Bus, CasConflict, Received, ServiceContext
from powerguard.bus.agents import AgentWatch
from powerguard.bus.roles import durable_filters, durable_names
from powerguard.bus.tracing import parse_traceparent
from powerguard.schemas import (
    AgentData,
    CheckpointDurable,
    CheckpointFailed,
    ConfigError,
    Envelope,
    ForcedShutdown,
    JobRestarted,
    JobResumed,
    LowBattery,
    NodeState,
    PowerActionFailed,
    PowerEvent,
    SiteConfig,
    new_id,
)

from . import metrics, saga
from .lease import Lease
from .outbox import command_event, state_events
from .policy import Policy
from .saga import Ack, Command, Input, NodeReport, Power, Resumed, SagaRecord, Tick, UpsView
from .spans import emit_finished, root_context
from .store import SagaStore
from .topology import AgentRegistry, Topology

log = logging.getLogger(__name__)

INPUT_TYPES = (
    PowerEvent,
    CheckpointDurable,
    CheckpointFailed,
    NodeState,
    PowerActionFailed,
    JobResumed,
    JobRestarted,
)


class _Open:
    """An open saga in memory: the record and the KV revision it was read or written at."""

    def __init__(self, rec: SagaRecord, revision: int) -> None:
        self.rec = rec
        self.revision = revision


class Coordinator:
    def __init__(self, bus: Bus, site: SiteConfig, *, policy: Policy | None = None, instance: str | None = None):
        self.bus = bus
        self.site = site
        self.topo = Topology.from_site(site)
        self.policy = policy or site.settings("coordinator", Policy)
        metrics.RESERVE.set(self.policy.shutdown_reserve_s)
        self.instance = instance or socket.gethostname()
        self.registry = AgentRegistry(ttl_s=bus.limits.agents_ttl_s)
        self.ups: dict[str, UpsView] = {}
        self.open: dict[str, _Open] = {}
        self.leader = False
        self._lock = asyncio.Lock()
        self._consumer = None
        self._watch: AgentWatch | None = None
        self._store: SagaStore | None = None
        self._lease: Lease | None = None
        self._resend: set[str] = set()  # sagas whose last publish failed: re-send what is pending
        self._newest: dict[str, float] = {}  # UPS -> time of the newest power event applied

    # ------------------------------------------------------------------ lifecycle
    async def run(self, stopping: asyncio.Event, on_ready=None) -> None:
        self._store = SagaStore(await self.bus.sagas())
        self._lease = Lease(
            await self.bus.leases(),
            key=f"coordinator.{self.site.site}",
            holder=self.instance,
            ttl_s=self.policy.lease_ttl_s,
        )
        if on_ready:
            on_ready()
        log.info(
            "coordinator %s ready for site %s (lease ttl %.1fs)", self.instance, self.site.site, self.policy.lease_ttl_s
        )
        renew_every = self.policy.lease_ttl_s / 3
        last_renew = 0.0
        try:
            while not stopping.is_set():
                if time.monotonic() - last_renew >= renew_every or not self.leader:
                    last_renew = time.monotonic()
                    try:
                        held = await self._lease.keep()
                    except Exception as exc:
                        log.warning("lease check failed: %s", exc)
                        held = False
                    if held and not self.leader:
                        await self._lead()
                    elif not held and self.leader:
                        await self._follow("lease lost")
                if self.leader:
                    try:
                        await self.tick()
                    except Exception as exc:  # KV or broker trouble: the next tick retries, the process lives
                        metrics.TICK_ERRORS.inc()
                        log.error("tick failed (retried at the next tick): %s", exc)
                try:
                    await asyncio.wait_for(stopping.wait(), self.policy.tick_s if self.leader else renew_every)
                except TimeoutError:
                    pass
        finally:
            if self.leader:
                await self._follow("stopping")
                await self._lease.release()

    async def _lead(self) -> None:
        log.info("%s leads site %s", self.instance, self.site.site)
        self.leader = True
        metrics.LEADER.set(1)
        self._watch = AgentWatch(self.bus, self._on_agent)
        await self._watch.start()
        try:
            await asyncio.wait_for(self._watch.ready.wait(), 10)
        except TimeoutError:
            log.warning("agent registry not fully loaded after 10s; continuing")
        self.open = {r.saga_id: _Open(r, rev) for r, rev in await self._store.load(site=self.site.site, open_only=True)}
        for o in self.open.values():
            for r in o.rec.ups:
                self.ups.setdefault(r, o.rec.ups[r].model_copy())
            again = saga.pending(o.rec, self.policy)
            log.info("resuming saga %s in state %s; re-sending %d command(s)", o.rec.saga_id, o.rec.state, len(again))
            await self._publish(o.rec, again, resend=True)
        metrics.OPEN_SAGAS.set(len(self.open))
        durable = durable_names(self.site.site)["coordinator"]
        self._consumer = await self.bus.consume_batches(
            *INPUT_TYPES,
            batch_handler=self.on_batch,
            durable=durable,
            subject=durable_filters(self.bus.names, self.site.site)[durable],
            batch=512,
            since_s=self.policy.max_event_age_s,
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
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None
        if self._watch is not None:
            await self._watch.stop()
            self._watch = None

    def _on_agent(self, agent: AgentData | None, key: str, seen_at: float) -> None:
        if agent is None:
            self.registry.remove_key(key)
        else:
            # the coordinator's own clock: the KV timestamp is the server's, and a skew between
            # the two would make every rank look expired (a saga without checkpoint requests)
            self.registry.update(agent, time.time())

    # ------------------------------------------------------------------ inputs
    async def on_batch(self, items: list[Received]) -> None:
        async with self._lock:
            if not self.leader:
                raise RuntimeError("not the leader")
            now = time.time()
            before = {sid: self._snapshot(o.rec) for sid, o in self.open.items()}
            out: dict[str, list[Command]] = {}
            inputs: dict[str, list[Input]] = {}
            for item in items:
                self._route(item, now, inputs, out)
            for sid, batch in inputs.items():
                if sid in self.open:
                    self._apply(self.open[sid], batch, now, out)
            await self._commit(before, out, now)

    def _route(self, item: Received, now: float, inputs: dict[str, list[Input]], out: dict[str, list[Command]]) -> None:
        """Turn one event into saga inputs (queued per saga in ``inputs``)."""
        ev = item.event
        if isinstance(ev, PowerEvent):
            d = ev.data
            if d.site != self.site.site:
                return
            if d.ups not in self.topo.ups:
                metrics.IGNORED.labels("unknown_ups").inc()
                log.warning("power event for unknown UPS %s (site %s) ignored", d.ups, d.site)
                return
            age = now - ev.time.timestamp()
            if age > self.policy.max_event_age_s:
                metrics.IGNORED.labels("stale").inc()
                log.warning("%s of %s from %.0fs ago ignored (max_event_age_s)", ev.short_type, d.ups, age)
                return
            newest = self._newest.get(d.ups)
            if newest is not None and ev.time.timestamp() < newest:
                metrics.IGNORED.labels("late").inc()  # a redelivery or a late copy: the UPS said more since
                log.info("%s of %s older than its newest reading ignored", ev.short_type, d.ups)
                return
            self._newest[d.ups] = ev.time.timestamp()
            current = self.ups.get(d.ups)
            if current is not None and current.drill and current.on_battery and not d.drill and not d.on_battery:
                return  # the UPS's real telemetry (on line) must not end a drill of it
            p = Power(
                drill=d.drill,
                ups=d.ups,
                on_battery=d.on_battery,
                runtime_s=d.runtime_s,
                charge_pct=d.charge_pct,
                low_battery=isinstance(ev, LowBattery) or "LB" in d.status,
                fsd=isinstance(ev, ForcedShutdown) or "FSD" in d.status,
            )
            view = self.ups.setdefault(d.ups, UpsView(since=now))
            if view.on_battery != p.on_battery:
                view.since = now
            view.on_battery, view.low_battery, view.fsd = p.on_battery, p.low_battery, p.fsd
            view.drill = p.drill and p.on_battery
            view.runtime_s = p.runtime_s if p.runtime_s is not None else view.runtime_s
            view.charge_pct = p.charge_pct if p.charge_pct is not None else view.charge_pct
            if self.open:
                for sid in self.open:
                    inputs.setdefault(sid, []).append(p)
            else:
                self._maybe_start(now, parse_traceparent(item.headers.get("traceparent")), out)
            return
        if isinstance(ev, CheckpointDurable | CheckpointFailed):
            d = ev.data
            o = self.open.get(d.saga_id or "")
            if o is None:
                metrics.IGNORED.labels("unknown_saga").inc()
                log.info("ack from %s rank %d for saga %s that is not open: ignored", d.job, d.rank, d.saga_id)
                return
            ok = isinstance(ev, CheckpointDurable)
            if ok and ev.data.durations is not None and ev.data.durations.total_s is not None:
                metrics.CHECKPOINT_SECONDS.labels(d.job).observe(ev.data.durations.total_s)
            ack = Ack(
                job=d.job, rank=d.rank, request_id=d.request_id, step=d.step, ok=ok, error=None if ok else ev.data.error
            )
            inputs.setdefault(o.rec.saga_id, []).append(ack)
            return
        if isinstance(ev, NodeState):
            state = {"off": "off", "ready": "ready"}.get(ev.data.state)
            if state:
                self._to_node_saga(ev.data.node, NodeReport(node=ev.data.node, state=state), inputs)
            return
        if isinstance(ev, PowerActionFailed):
            d = ev.data
            kind = "failed_on" if d.action == "on" else "failed_off" if d.action in ("off", "soft_off") else None
            if kind:
                self._to_node_saga(d.node, NodeReport(node=d.node, state=kind, detail=d.error), inputs)
            return
        if isinstance(ev, JobResumed):
            for sid, o in self.open.items():
                if ev.data.job in o.rec.jobs:
                    inputs.setdefault(sid, []).append(Resumed(job=ev.data.job, step=ev.data.step))
        if isinstance(ev, JobRestarted) and ev.data.dry_run:  # a drill: the job never stopped, so it "resumed"
            for sid, o in self.open.items():
                if o.rec.drill and ev.data.saga_id == sid and ev.data.job in o.rec.jobs:
                    inputs.setdefault(sid, []).append(Resumed(job=ev.data.job, step=None))

    def _to_node_saga(self, node: str, report: NodeReport, inputs: dict[str, list[Input]]) -> None:
        for sid, o in self.open.items():
            if node in o.rec.nodes:
                inputs.setdefault(sid, []).append(report)

    def _apply(self, o: _Open, inp: Input | list[Input], now: float, out: dict[str, list[Command]]) -> None:
        cmds = saga.handle(
            o.rec, inp, now=now, topo=self.topo, policy=self.policy, jobs=lambda: self.registry.jobs(now)
        )
        out.setdefault(o.rec.saga_id, []).extend(cmds)

    def _maybe_start(self, now: float, trace: tuple[str, str] | None, out: dict[str, list[Command]]) -> None:
        on_battery = [u for u, v in self.ups.items() if v.on_battery]
        if self.open or not self.topo.nodes_at_risk(on_battery):
            return
        saga_id = f"{self.site.site}-{datetime.fromtimestamp(now, UTC):%Y%m%dT%H%M%S}-{secrets.token_hex(2)}"
        rec = saga.start(
            saga_id=saga_id,
            topo=self.topo,
            ups=self.ups,
            jobs=self.registry.jobs(now),
            now=now,
            trace=trace,
            hold_policy=self.policy.hold_policy,
        )
        self.open[saga_id] = _Open(rec, 0)
        log.info("saga %s started: nodes at risk %s, jobs %s", saga_id, rec.at_risk, sorted(rec.jobs))
        self._apply(self.open[saga_id], Tick(), now, out)

    # ------------------------------------------------------------------ clock
    async def tick(self) -> None:
        async with self._lock:
            if not self.leader or not self.open:
                return
            now = time.time()
            for sid in list(self._resend):
                if sid in self.open:
                    self._resend.discard(sid)
                    await self._publish(self.open[sid].rec, saga.pending(self.open[sid].rec, self.policy), resend=True)
            before = {sid: self._snapshot(o.rec) for sid, o in self.open.items()}
            out: dict[str, list[Command]] = {}
            for o in list(self.open.values()):
                self._apply(o, Tick(), now, out)
            await self._commit(before, out, now)

    # ------------------------------------------------------------------ output
    @staticmethod
    def _snapshot(rec: SagaRecord) -> tuple[str, int]:
        return rec.model_dump_json(exclude={"updated_at"}), len(rec.history)

    async def _commit(self, before: dict[str, tuple[str, int]], out: dict[str, list[Command]], now: float) -> None:
        for sid, o in list(self.open.items()):
            snap, n_hist = before.get(sid, ("", 0))
            if self._snapshot(o.rec)[0] == snap and not out.get(sid):
                continue
            emit_finished(self.bus.tracer, o.rec, now)  # marks spans as done in the record
            try:
                if o.revision == 0:
                    o.revision = await self._store.create(o.rec)
                else:
                    o.revision = await self._store.save(o.rec, o.revision)
            except CasConflict:
                log.error("saga %s was written by another coordinator: stepping down", sid)
                await self._follow("saga written elsewhere")
                raise
            for t in o.rec.history[n_hist:]:
                metrics.TRANSITIONS.labels(t.state.value).inc()
                log.info("saga %s -> %s (%s)", sid, t.state.value, t.reason)
            await self._publish(o.rec, out.get(sid, []), state_from=n_hist)
            if o.rec.terminal:
                del self.open[sid]
        metrics.OPEN_SAGAS.set(len(self.open))
        if not self.open:
            pending: dict[str, list[Command]] = {}
            self._maybe_start(now, None, pending)  # e.g. power failed again while restoring
            if pending:
                await self._commit({}, pending, now)

    async def _publish(
        self, rec: SagaRecord, cmds: list[Command], state_from: int | None = None, *, resend: bool = False
    ) -> None:
        """Publish state events and commands (stored in the record first). A first publish that
        JetStream reports as a duplicate was squatted: alarm, and publish it again under a fresh
        id (receivers deduplicate by idempotency key)."""
        events: list[Envelope] = []
        if state_from is not None:
            events += state_events(rec, state_from)
        events += [command_event(rec, c) for c in cmds]
        for c in cmds:
            metrics.COMMANDS.labels(c.kind).inc()
        if not events:
            return
        token = otel_context.attach(root_context(rec))
        try:
            sem = asyncio.Semaphore(128)

            async def one(ev: Envelope) -> None:
                async with sem:
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

            results = await asyncio.gather(*(one(e) for e in events), return_exceptions=True)
        finally:
            otel_context.detach(token)
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            # the record is stored; the next tick re-sends what is pending (receivers deduplicate)
            log.error(
                "saga %s: %d of %d events not stored (%s); re-sending on the next tick",
                rec.saga_id,
                len(failed),
                len(events),
                failed[0],
            )
            self._resend.add(rec.saga_id)


async def main(ctx: ServiceContext) -> None:
    if ctx.site is None:
        raise ConfigError("the coordinator needs --config site.yaml (its topology and policy)")
    instance = getattr(ctx.args, "instance", None) if ctx.args else None
    coordinator = Coordinator(ctx.bus, ctx.site, instance=instance)
    await coordinator.run(ctx.stopping, on_ready=lambda: ctx.set_ready(True))
