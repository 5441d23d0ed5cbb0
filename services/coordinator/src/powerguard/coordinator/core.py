"""The coordinator's pure site core: every outage rule of one site, without I/O.

:class:`SiteCore` owns the UPS views, the open sagas and the agent registry of a site, and
turns received events (plain :class:`~powerguard.schemas.Envelope` objects) and clock ticks
into saga records to store and commands to publish::

    step = core.apply([(event, trace), ...], now)   # or core.tick(now)
    for rec in step.changed: store(rec) ... publish(step.commands[rec.saga_id])

Here live the rules that decide which saga an event belongs to (routing and result
matching, always by saga id where the event carries one), when a saga starts, what a UPS's
status flags mean, and how a drill and a real outage mix. The service (``service.py``)
keeps only the lease, the consumer, compare-and-set writes and publishing.
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
)

from . import saga
from .policy import Policy
from .saga import Ack, Command, Input, NodeReport, Power, Resumed, SagaRecord, Tick, UpsView, observe
from .topology import AgentRegistry, Topology

Trace = tuple[str, str] | None  # (trace id, span id) of the event's producer


@dataclass(frozen=True)
class Notice:
    """An event the core set aside, with why (``reason`` is a metric label)."""

    reason: str  # unknown_ups | stale | late | unknown_saga | unmatched
    message: str


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
        drill=d.drill and d.on_battery,
    )


def _concerns_sagas(ev: Envelope) -> bool:
    """Results a saga waits for; the rest (progress states, job-level failures, real restarts
    whose agent reports the resume itself) change nothing."""
    if isinstance(ev, NodeState):
        return ev.data.state in ("off", "ready")
    if isinstance(ev, PowerActionFailed):
        return ev.data.action in ("on", "off", "soft_off")
    if isinstance(ev, JobRestarted):
        return ev.data.dry_run
    return isinstance(ev, CheckpointDurable | CheckpointFailed | JobResumed)


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
        saga_id: Callable[[str, float], str] = new_saga_id,
    ) -> None:
        self.topo = topo
        self.policy = policy
        self.registry = registry if registry is not None else AgentRegistry()
        self.ups: dict[str, UpsView] = {}
        self.open: dict[str, SagaRecord] = {}
        self._newest: dict[str, float] = {}  # UPS -> time of the newest power event applied
        self._saga_id = saga_id

    # ------------------------------------------------------------------ state
    def resume(self, records: Iterable[SagaRecord]) -> dict[str, list[Command]]:
        """Take over open sagas (read from the store); returns what each must re-send."""
        self.open = {}
        again: dict[str, list[Command]] = {}
        for rec in records:
            if rec.terminal:
                continue
            self.open[rec.saga_id] = rec
            for u, v in rec.ups.items():
                self.ups.setdefault(u, v.model_copy())
            again[rec.saga_id] = saga.pending(rec, self.policy)
        return again

    # ------------------------------------------------------------------ inputs
    def apply(self, events: Sequence[tuple[Envelope, Trace]], now: float) -> Step:
        """Apply received events in order, then advance every saga once."""
        before = {sid: (_snapshot(r), len(r.history)) for sid, r in self.open.items()}
        step = Step()
        inputs: dict[str, list[Input]] = {}
        for ev, trace in events:
            self._route(ev, trace, now, inputs, step)
        for sid, batch in inputs.items():
            if sid in self.open:
                self._handle(self.open[sid], batch, now, step)
        return self._finish(before, step, now)

    def tick(self, now: float) -> Step:
        """Advance every open saga on the clock (deadlines, timeouts, stability windows)."""
        before = {sid: (_snapshot(r), len(r.history)) for sid, r in self.open.items()}
        step = Step()
        for rec in list(self.open.values()):
            self._handle(rec, Tick(), now, step)
        return self._finish(before, step, now)

    def _route(self, ev: Envelope, trace: Trace, now: float, inputs: dict[str, list[Input]], step: Step) -> None:
        """One event -> saga inputs, queued per saga. Results go to the saga they name."""
        if isinstance(ev, PowerEvent):
            p = self._power(ev, now, step)
            if p is None:
                return
            if self.open:
                for sid in self.open:
                    inputs.setdefault(sid, []).append(p)
            else:
                self._maybe_start(now, trace, step)
            return
        if not _concerns_sagas(ev):
            return
        data = ev.data
        sid = getattr(data, "saga_id", None)
        if isinstance(ev, JobResumed) and sid not in self.open:
            # an agent that names no open saga: restarted without POWERGUARD_SAGA in its
            # environment and restored a periodic checkpoint (no saga) or an older outage's.
            # Its job resumed all the same: it counts for the saga restoring that job.
            sid = next((s for s, r in self.open.items() if data.job in r.jobs and r.state == saga.S.RESTORING), sid)
        rec = self.open.get(sid or "")
        if rec is None:
            step.notices.append(Notice("unknown_saga", f"{ev.short_type} for saga {sid} that is not open: ignored"))
            return
        inp = self._result(ev, rec)
        if inp is None:
            step.notices.append(Notice("unmatched", f"{ev.short_type} does not belong to saga {sid}: ignored"))
            return
        inputs.setdefault(rec.saga_id, []).append(inp)

    def _power(self, ev: PowerEvent, now: float, step: Step) -> Power | None:
        """A power event as a reading of a known UPS, or None (set aside with a notice)."""
        d = ev.data
        if d.site != self.topo.site:
            return None
        if d.ups not in self.topo.ups:
            step.notices.append(Notice("unknown_ups", f"power event for unknown UPS {d.ups} (site {d.site}) ignored"))
            return None
        at = ev.time.timestamp()
        if now - at > self.policy.max_event_age_s:
            step.notices.append(
                Notice("stale", f"{ev.short_type} of {d.ups} from {now - at:.0f}s ago ignored (max_event_age_s)")
            )
            return None
        newest = self._newest.get(d.ups)
        if newest is not None and at < newest:  # a redelivery or a late copy: the UPS said more since
            step.notices.append(Notice("late", f"{ev.short_type} of {d.ups} older than its newest reading ignored"))
            return None
        self._newest[d.ups] = at
        current = self.ups.get(d.ups)
        if current is not None and current.drill and not d.drill and not d.on_battery:
            return None  # the UPS's real telemetry (on line) must not end a drill of it
        p = reading(ev)
        observe(self.ups, p, now)
        return p

    @staticmethod
    def _result(ev: Envelope, rec: SagaRecord) -> Input | None:
        """A result as an input of the saga it names (None: it does not fit that saga)."""
        d = ev.data
        if isinstance(ev, CheckpointDurable | CheckpointFailed):
            ok = isinstance(ev, CheckpointDurable)
            error = None if ok else d.error
            level = d.durability if ok else "local"
            return Ack(
                job=d.job, rank=d.rank, request_id=d.request_id, step=d.step, ok=ok, error=error, durability=level
            )
        if isinstance(ev, NodeState):
            return NodeReport(node=d.node, state=d.state, detail=d.detail) if d.node in rec.nodes else None
        if isinstance(ev, PowerActionFailed):
            kind = "failed_on" if d.action == "on" else "failed_off"
            return NodeReport(node=d.node, state=kind, detail=d.error) if d.node in rec.nodes else None
        if isinstance(ev, JobResumed):
            return Resumed(job=d.job, step=d.step) if d.job in rec.jobs else None
        if isinstance(ev, JobRestarted):  # a drill's dry-run restart: the job never stopped, so it "resumed"
            return Resumed(job=d.job, step=None) if rec.drill and d.job in rec.jobs else None
        return None

    # ------------------------------------------------------------------ sagas
    def _handle(self, rec: SagaRecord, inp: Input | list[Input], now: float, step: Step) -> None:
        cmds = saga.handle(rec, inp, now=now, topo=self.topo, policy=self.policy, jobs=lambda: self.registry.jobs(now))
        step.commands.setdefault(rec.saga_id, []).extend(cmds)

    def _maybe_start(self, now: float, trace: Trace, step: Step) -> None:
        """A saga starts when no saga is open and some node has every feed on battery."""
        on_battery = [u for u, v in self.ups.items() if v.on_battery]
        if self.open or not self.topo.nodes_at_risk(on_battery):
            return
        rec = saga.start(
            saga_id=self._saga_id(self.topo.site, now),
            topo=self.topo,
            ups=self.ups,
            jobs=self.registry.jobs(now),
            now=now,
            trace=trace,
            hold_policy=self.policy.hold_policy,
        )
        self.open[rec.saga_id] = rec
        step.started.append(rec.saga_id)
        self._handle(rec, Tick(), now, step)

    def _finish(self, before: dict[str, tuple[str, int]], step: Step, now: float) -> Step:
        """Collect what changed; drop ended sagas; start the next one if power is still out
        (e.g. it failed again while the last one restored)."""
        for sid, rec in list(self.open.items()):
            snap, n_hist = before.get(sid, ("", 0))
            if _snapshot(rec) == snap and not step.commands.get(sid):
                continue
            step.changed.append(rec)
            step.history_from[sid] = n_hist
            if rec.terminal:
                del self.open[sid]
        if not self.open:
            more = Step()
            self._maybe_start(now, None, more)
            for rec in self.open.values():  # the one just started, if any
                step.changed.append(rec)
                step.history_from[rec.saga_id] = 0
            step.started += more.started
            for sid, cmds in more.commands.items():
                step.commands.setdefault(sid, []).extend(cmds)
        return step
