"""The coordinator's pure site core: every outage rule of one site, without I/O.

:class:`SiteCore` owns the UPS views, the open sagas and the agent registry of a site, and
turns received events (plain :class:`~powerguard.schemas.Envelope` objects) and clock ticks
into saga records to store and commands to publish::

    step = core.apply([(event, trace), ...], now)   # or core.tick(now)
    for rec in step.changed: store(rec) ... publish(step.commands[rec.saga_id])

Here live the rules that decide which saga an event belongs to (routing and result
matching, always by saga id where the event carries one), when a saga starts, what a UPS's
status flags mean, and how a drill and a real outage mix. The service (``service.py``)
keeps only the lease, the consumers, compare-and-set writes and publishing.

**Drills live apart from reality.** A drill's readings (``powerguard drill``, on its own
subject) go into their own table of UPS views with their own newest time per UPS, and only to
drill sagas; real readings only to real sagas. A real saga never sees what a drill holds; a
drill saga never joins a node or job a real saga holds, and a drill whose nodes or jobs a real
saga comes to hold ends ``cancelled`` (:func:`saga.give_way`). So for any interleaving of
drill and real events the real sagas decide exactly what they would without the drill's
(``tests/unit/coordinator/test_core_properties.py``). An event stamped further in the future
than ``max_clock_skew_s`` is set aside by name (``future``) whoever sent it, and no reading
moves a UPS's newest time past the coordinator's own clock.

**Protection never pauses.** After every input, every node at risk (every feed on battery) is
held by exactly one open saga: at most one saga *protects* (is before its shutdown) and joins
the nodes at risk that no other saga holds; when none protects, a new saga starts for them,
beside sagas that are down or restoring. A node a saga has shut down and not powered on is
held by it (no other saga shuts it down again); a restoring saga whose nodes or jobs are at
risk again is superseded: it ends ``failed`` with the reason, and the protecting saga carries
what it had yet to restore. Node state reports still count only for the saga they name:
power-control names the saga of its latest command for the node in its periodic read-backs
and after an operator's ``powerguard power on/off``.

**Measured shutdowns.** When a real saga's shutdown ends, the core keeps, per node group (feed
set), how long its nodes took from the stop decision to off (the last five outages); each new
saga starts with the slowest of them (``SagaRecord.shutdown_need``), and its battery budget
uses them instead of the configured reserve.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from powerguard.schemas import (
    CheckpointDurable,
    CheckpointFailed,
    Envelope,
    ForcedShutdown,
    JobRestarted,
    JobResumed,
    LowBattery,
    NodeState,
    PowerActionFailed,
    PowerData,
    PowerEvent,
    SagaState,
    UpsOutputResult,
)

from . import saga
from .commands import pending
from .facts import observe
from .inputs import Ack, Command, Input, NodeReport, Power, Resumed, Tick, UpsReport
from .jobbook import JobBook
from .policy import Policy
from .record import SagaRecord, UpsView
from .states import supersede
from .topology import AgentRegistry, JobInfo, Topology

S = SagaState
Trace = tuple[str, str] | None  # (trace id, span id) of the event's producer


@dataclass(frozen=True)
class Notice:
    """An event the core set aside, with why (``reason`` is a metric label)."""

    reason: str  # unknown_ups | stale | future | late | unknown_saga | unmatched | repeated
    message: str
    ups: str | None = None  # a power event's UPS (the service reads a stale one's newest reading)
    drill: bool = False


@dataclass
class Step:
    """What one call changed: records to store (in this order), then commands to publish."""

    changed: list[SagaRecord] = field(default_factory=list)
    history_from: dict[str, int] = field(default_factory=dict)  # saga -> first new history entry
    commands: dict[str, list[Command]] = field(default_factory=dict)
    notices: list[Notice] = field(default_factory=list)
    started: list[str] = field(default_factory=list)


def new_saga_id(site: str, now: float) -> str:
    return f"{site}-{datetime.fromtimestamp(now, UTC):%Y%m%dT%H%M%S}-{secrets.token_hex(2)}"


def reading(ev: PowerEvent) -> Power:
    """What a power event says about its UPS. The status flags count like the event types
    (``LB`` as low battery, ``FSD`` as forced shutdown); low battery means nothing on line
    power (a UPS recharging after an outage still reports LB)."""
    d: PowerData = ev.data
    low = isinstance(ev, LowBattery) or "LB" in d.status
    return Power(
        ups=d.ups,
        on_battery=d.on_battery,
        runtime_s=d.runtime_s,
        charge_pct=d.charge_pct,
        low_battery=low and d.on_battery,
        fsd=isinstance(ev, ForcedShutdown) or "FSD" in d.status,
        drill=d.drill,
        load_pct=d.load_pct,
    )


_ACKS = (CheckpointDurable, CheckpointFailed)  # tuples: a union written in a call is built per call
_ALWAYS = (*_ACKS, JobResumed, UpsOutputResult)


def _concerns_sagas(ev: Envelope) -> bool:
    """Results a saga waits for; the rest (progress states, job-level failures, real restarts
    whose agent reports the resume itself) change nothing."""
    if isinstance(ev, _ALWAYS):  # first: 100,000 acks in a large outage
        return True
    if isinstance(ev, NodeState):
        return ev.data.state in ("off", "ready")
    if isinstance(ev, PowerActionFailed):
        return ev.data.action in ("on", "off", "soft_off")
    if isinstance(ev, JobRestarted):
        return ev.data.dry_run
    return False


def _requested_of(rec: SagaRecord, job: str, request_id: str | None) -> bool:
    """Whether ``request_id`` is one of the checkpoint rounds this saga opened for ``job``."""
    plan = rec.jobs.get(job)
    if plan is None or request_id is None:
        return False
    return request_id == plan.request_id or any(
        r is not None and r.request_id == request_id for r in (plan.final, plan.hold)
    )


def _snapshot(rec: SagaRecord) -> str:
    return rec.model_dump_json(exclude={"updated_at"})


class SiteCore:
    """Every outage rule of one site as a pure object (inject ``now``; ``saga_id`` makes ids)."""

    def __init__(
        self,
        topo: Topology,
        policy: Policy,
        *,
        registry: AgentRegistry | None = None,
        book: JobBook | None = None,
        saga_id: Callable[[str, float], str] = new_saga_id,
    ) -> None:
        self.topo = topo
        self.policy = policy
        self.registry = registry if registry is not None else AgentRegistry()
        self.book = book  # the jobs the site knows, durable: those the registry lost are still protected
        self.ups: dict[str, UpsView] = {}  # the real readings
        self.drill_ups: dict[str, UpsView] = {}  # a drill's readings: never mixed with the real ones
        self.open: dict[str, SagaRecord] = {}
        self._newest: dict[tuple[str, bool], float] = {}  # (UPS, drill) -> time of the newest reading applied
        # saga -> (job, request, level) a job's rank 0 acked for every rank: each taken once, so a job's
        # own agent cannot make one message cost the coordinator its world's ranks again and again
        self._spoken: dict[str, set[tuple[str | None, str]]] = {}
        self._saga_id = saga_id
        self.measured: dict[str, list[float]] = {}  # node group -> shutdowns of the latest real outages, s
        self._learned: set[str] = set()

    # ------------------------------------------------------------------ state
    def resume(self, records: Iterable[SagaRecord]) -> dict[str, list[Command]]:
        """Take over open sagas (read from the store; ended ones teach the measured shutdowns);
        returns what each open one must re-send."""
        self.open = {}
        again: dict[str, list[Command]] = {}
        for rec in records:
            self.learn(rec)
            if rec.terminal:
                continue
            self.open[rec.saga_id] = rec
            for u, v in rec.ups.items():
                self.views(rec.drill).setdefault(u, v.model_copy(deep=True))
            again[rec.saga_id] = pending(rec, self.policy)
        return again

    def jobs(self, now: float) -> dict[str, JobInfo]:
        """The jobs an outage protects: the registry's live ones, and every job the book knows
        that the registry lacks now (lost with a broker restart, lapsed, or refused): silent,
        asked all the same, waited for until the deadline."""
        live = self.registry.jobs(now)
        if self.book is not None:
            live = self.book.complete(live)  # a job heard again by some of its ranks: the rest from the book
            live.update(self.book.missing(live))
        return live

    def views(self, drill: bool) -> dict[str, UpsView]:
        """The UPS views of the real site, or of the drills."""
        return self.drill_ups if drill else self.ups

    # ------------------------------------------------------------------ inputs
    def learn(self, rec: SagaRecord) -> None:
        """Keep a real saga's measured shutdown per node group, once its shutdown has ended."""
        if rec.drill or rec.saga_id in self._learned or rec.state.before_shutdown:
            return
        if rec.state == S.SHUTTING_DOWN or (rec.state == S.FAILED and rec.shutdown_started_at is None):
            return
        took: dict[str, float] = {}
        for node, p in rec.nodes.items():
            if p.shutdown_at is None or p.off_at is None or p.error is not None or node not in self.topo.feeds:
                continue
            group = self.topo.group_key(self.topo.feeds[node])
            took[group] = max(took.get(group, 0.0), p.off_at - p.shutdown_at)
        self._learned.add(rec.saga_id)
        for group, seconds in took.items():
            kept = self.measured.setdefault(group, [])
            kept.append(round(seconds, 3))
            del kept[:-5]

    def shutdown_need(self) -> dict[str, float]:
        """Node group -> the slowest of its measured shutdowns (what a new saga starts with)."""
        return {g: max(v) for g, v in self.measured.items() if v}

    def apply(self, events: Sequence[tuple[Envelope, Trace]], now: float) -> Step:
        """Apply received events in order, then advance every saga once.

        Routing reads the records and changes none of them, so it runs first: a saga fed inputs
        is taken as changed (stored again; a save of what did not change writes no part), and
        only the others are compared before and after. A batch of acks costs what it adds,
        not two serializations of a record that grows with the site."""
        step = Step()
        inputs: dict[str, list[Input]] = {}
        first_trace: list[Trace] = []
        for ev, trace, *stored in events:
            if isinstance(ev, PowerEvent) and not first_trace:
                first_trace.append(trace)
            self._route(ev, trace, now, inputs, step, stored[0] if stored else None)
        before = {sid: (None if sid in inputs else _snapshot(r), len(r.history)) for sid, r in self.open.items()}
        for sid, batch in inputs.items():
            if sid in self.open:
                self._handle(self.open[sid], batch, now, step)
        return self._finish(before, step, now, first_trace[0] if first_trace else None)

    def tick(self, now: float) -> Step:
        """Advance every open saga on the clock (deadlines, timeouts, stability windows)."""
        before = {sid: (_snapshot(r), len(r.history)) for sid, r in self.open.items()}
        step = Step()
        for rec in list(self.open.values()):
            self._handle(rec, Tick(), now, step)
        return self._finish(before, step, now)

    def _route(
        self,
        ev: Envelope,
        trace: Trace,
        now: float,
        inputs: dict[str, list[Input]],
        step: Step,
        stored_at: float | None = None,
    ) -> None:
        """One event -> saga inputs, queued per saga. Results go to the saga they name."""
        if isinstance(ev, PowerEvent):
            p = self._power(ev, now, step, stored_at)
            if p is not None:
                for sid, rec in self.open.items():
                    if rec.drill == p.drill:  # a drill's readings reach drill sagas only, and real ones real sagas
                        inputs.setdefault(sid, []).append(p)
            return
        if not _concerns_sagas(ev):
            return
        data = ev.data
        sid = getattr(data, "saga_id", None)
        if isinstance(ev, JobResumed) and sid not in self.open:
            # an agent that names no open saga: restarted without POWERGUARD_SAGA in its
            # environment and restored a periodic checkpoint (no saga) or an older outage's.
            # Its job resumed all the same: it counts for the saga restoring that job.
            sid = next(
                (
                    s
                    for s, r in self.open.items()
                    if (data.job in r.jobs or data.job in r.carried) and r.state == S.RESTORING
                ),
                sid,
            )
        rec = self.open.get(sid or "")
        if rec is None:
            step.notices.append(Notice("unknown_saga", f"{ev.short_type} for saga {sid} that is not open: ignored"))
            return
        if isinstance(ev, CheckpointDurable) and data.ranks is not None:
            # a job's ack for its ranks counts once per (job, request, level), and only for a
            # request this saga sent that very job: another job's agent naming this job's request
            # in its own ack (it may publish only on its own job's subject) is unmatched, never
            # recorded in the job's place
            if not _requested_of(rec, data.job, data.request_id):
                text = f"{ev.short_type} of job {data.job} names request {data.request_id}, not its own: ignored"
                step.notices.append(Notice("unmatched", text))
                return
            spoken = self._spoken.setdefault(rec.saga_id, set())
            said = (data.job, data.request_id, data.durability)
            if said in spoken:
                text = f"{ev.short_type} of job {data.job} for all its ranks repeated: ignored"
                step.notices.append(Notice("repeated", text))
                return
            spoken.add(said)
        inp = self._result(ev, rec)
        if inp is None:
            step.notices.append(Notice("unmatched", f"{ev.short_type} does not belong to saga {sid}: ignored"))
            return
        inputs.setdefault(rec.saga_id, []).append(inp)

    def _power(self, ev: PowerEvent, now: float, step: Step, stored_at: float | None = None) -> Power | None:
        """A power event as a reading of a known UPS, or None (set aside with a notice). Its age
        and whether it lies in the future are judged by ``stored_at``, when JetStream stored it
        (the server's clock, not the publisher's: a ups-monitor whose clock is minutes off is
        still heard); the publisher's own time orders its readings only."""
        d = ev.data
        if d.site != self.topo.site:
            return None
        if d.ups not in self.topo.ups:
            step.notices.append(Notice("unknown_ups", f"power event for unknown UPS {d.ups} (site {d.site}) ignored"))
            return None
        at = ev.time.timestamp()
        when = stored_at if stored_at is not None else at
        if when - now > self.policy.max_clock_skew_s:
            step.notices.append(
                Notice(
                    "future",
                    f"{ev.short_type} of {d.ups} stored {when - now:.0f}s in the future ignored (max_clock_skew_s)",
                    d.ups,
                    d.drill,
                )
            )
            return None
        if now - when > self.policy.max_event_age_s:
            text = f"{ev.short_type} of {d.ups} from {now - when:.0f}s ago ignored (max_event_age_s)"
            step.notices.append(Notice("stale", text, d.ups, d.drill))
            return None
        key = (d.ups, d.drill)
        newest = self._newest.get(key)
        if newest is not None and at < newest:  # a redelivery or a late copy: the UPS said more since
            step.notices.append(Notice("late", f"{ev.short_type} of {d.ups} older than its newest reading ignored"))
            return None
        self._newest[key] = min(at, now)  # a reading stamped ahead (within the skew) never hides the next ones
        p = reading(ev)
        observe(self.views(d.drill), p, now)
        return p

    @staticmethod
    def _result(ev: Envelope, rec: SagaRecord) -> Input | None:
        """A result as an input of the saga it names (None: it does not fit that saga)."""
        d = ev.data
        if isinstance(ev, _ACKS):
            ok = isinstance(ev, CheckpointDurable)
            error = None if ok else d.error
            level = d.durability if ok else "local"
            return Ack(
                job=d.job,
                rank=d.rank,
                request_id=d.request_id,
                step=d.step,
                ok=ok,
                error=error,
                durability=level,
                commit=d.commit if ok else None,
                ranks=tuple(d.ranks) if ok and d.ranks is not None else None,
            )
        if isinstance(ev, NodeState):
            return NodeReport(node=d.node, state=d.state, detail=d.detail) if d.node in rec.nodes else None
        if isinstance(ev, PowerActionFailed):
            kind = "failed_on" if d.action == "on" else "failed_off"
            return NodeReport(node=d.node, state=kind, detail=d.error) if d.node in rec.nodes else None
        if isinstance(ev, JobResumed):
            return Resumed(job=d.job, step=d.step) if d.job in rec.jobs or d.job in rec.carried else None
        if isinstance(ev, UpsOutputResult):
            return UpsReport(ups=d.ups, ok=d.ok, detail=d.error or d.detail) if d.ups in rec.ups_off else None
        if isinstance(ev, JobRestarted):  # a drill's dry-run restart: the job never stopped, so it "resumed"
            return Resumed(job=d.job, step=None) if rec.drill and d.job in rec.jobs else None
        return None

    # ------------------------------------------------------------------ sagas
    def _held_elsewhere(self, rec: SagaRecord) -> frozenset[str]:
        """Nodes other open sagas hold: a real saga minds only real sagas (no drill restricts it),
        a drill saga every other saga."""
        others = (r for r in self.open.values() if r is not rec and (rec.drill or not r.drill))
        return frozenset().union(*(saga.held_by(r) for r in others))

    def _handle(self, rec: SagaRecord, inp: Input | list[Input], now: float, step: Step) -> None:
        cmds = saga.handle(
            rec,
            inp,
            now=now,
            topo=self.topo,
            policy=self.policy,
            jobs=lambda: self.jobs(now),
            held=self._held_elsewhere(rec) if len(self.open) > 1 else frozenset(),
            ended=self.registry.ended,
        )
        step.commands.setdefault(rec.saga_id, []).extend(cmds)

    def _protect(self, now: float, trace: Trace, step: Step) -> None:
        """Reality first: the real sagas protect the nodes at risk, a drill gives way to a real
        saga holding its nodes or jobs, then the drill sagas protect what the drills put at risk
        and no real saga holds."""
        self._protect_world(False, now, trace, step)
        real = [r for r in self.open.values() if not r.drill and not r.terminal]
        for rec in [r for r in self.open.values() if r.drill and not r.terminal]:
            mine = set(rec.at_risk) | saga.held_by(rec)
            taken = next((r for r in real if saga.held_by(r) & mine or set(r.jobs) & set(rec.jobs)), None)
            if taken is not None:
                step.commands.setdefault(rec.saga_id, []).extend(saga.give_way(rec, taken, now))
        self._protect_world(True, now, trace, step)

    def _protect_world(self, drill: bool, now: float, trace: Trace, step: Step) -> None:
        """Every node at risk (in the real site, or in the drills) held by one open saga: the
        protecting saga joins the ones no saga holds, or a new saga starts for them; a restoring
        saga at risk again is superseded."""
        views = self.views(drill)
        risk = set(self.topo.nodes_at_risk([u for u, v in views.items() if v.on_battery]))
        if not risk:
            return
        world = [r for r in self.open.values() if r.drill == drill and not r.terminal]
        holders = [r for r in self.open.values() if not r.terminal] if drill else world
        held = frozenset().union(*(saga.held_by(r) for r in holders))
        protector = next((r for r in world if r.state.before_shutdown), None)
        if risk - held:
            if protector is not None:
                self._handle(protector, Tick(), now, step)  # joins them (what others hold excluded)
            else:
                protector = saga.start(
                    saga_id=self._saga_id(self.topo.site, now),
                    topo=self.topo,
                    ups=views,
                    jobs=self.jobs(now),
                    now=now,
                    trace=trace,
                    hold_policy=self.policy.hold_policy,
                    held=held,
                    shutdown_need=self.shutdown_need(),
                    drill=drill,
                )
                self.open[protector.saga_id] = protector
                step.started.append(protector.saga_id)
                self._handle(protector, Tick(), now, step)
        if protector is None or protector.terminal:
            return
        ours = set(protector.at_risk)
        for rec in world:
            if rec is protector or rec.state != S.RESTORING:
                continue
            jobs = set(rec.jobs) | set(rec.carried)
            if ours & set(rec.nodes) or jobs & set(protector.jobs):
                supersede(rec, protector, now)

    def _finish(self, before: dict[str, tuple[str | None, int]], step: Step, now: float, trace: Trace = None) -> Step:
        """Protect every node at risk (above); collect what changed (a saga fed inputs, snapshot
        None, counts as changed); drop ended sagas (a real one whose shutdown ended teaches its
        measured shutdown)."""
        self._protect(now, trace, step)
        for sid, rec in list(self.open.items()):
            snap, n_hist = before.get(sid, ("", 0))
            if snap is not None and not step.commands.get(sid) and _snapshot(rec) == snap:
                continue
            step.changed.append(rec)
            step.history_from[sid] = n_hist
            self.learn(rec)
            if rec.terminal:
                del self.open[sid]
                self._spoken.pop(sid, None)
        return step
