"""The outage saga as a pure state machine: inputs and a clock in, commands out. No I/O.

    detected -> checkpointing -> checkpointed | partial -> holding [-> final_checkpoint]
             -> shutting_down -> down | partly_down -> restoring -> resumed -> done
    exits: cancelled (power back before shutdown), failed (with a reason)

Down on battery with ``ups_off`` allowed, each UPS that fed the saga's nodes is told to cut its
output and return once :mod:`.killpower` says it may (everything it alone feeds off, every job
there durable, its runtime short or the site limit reached: the command ``ups_off``); the
restore then waits until the UPS has had time to cycle its output (``ups_off_return_s``).

A power checkpoint that failed is requested again as a new round (its own request id and
command key, ``ckpt.2``, ...) up to ``ckpt_retries`` times while the battery budget allows; a
node whose power-off failed is commanded off again (``shutdown.r1``) up to ``off_retries`` times,
and a shutdown where some node's off failed ends ``partly_down``, naming the nodes, never ``down``.

The battery budget is the time left until the battery is empty (the most conservative of the
UPS's estimate, the measured discharge and the site file's capacity: :mod:`.battery`) minus
what the shutdown needs (the node groups' measured shutdowns of earlier real outages times
``shutdown_factor``, or ``shutdown_reserve_s`` for a group never measured) minus ``margin_s``.
The hold ends on the configured reserve; the final checkpoint is taken whenever it fits the
budget, even below the reserve.

Protection never pauses: the site core (:mod:`.core`) keeps at most one saga *protecting*
nodes (before its shutdown) and passes every saga the nodes the others hold (``held``), so a
node is shut down by one saga only; a restoring saga whose nodes or jobs are at risk again is
superseded by the protecting one (:func:`supersede`), which carries its unfinished restore.

The hold policy of each job (site default, overridden by the job's registration) decides what
its ranks do during the hold: ``checkpoint-at-stop`` jobs train on and take a final checkpoint
at one step when the shutdown is decided (state ``final_checkpoint``, within what the battery
leaves before the shutdown reserve), then wait there until they are stopped; ``pause`` jobs wait
at the step boundary after their power checkpoint until a release (power back) or the stop;
``continue`` jobs train on and lose what they train after the checkpoint. The record keeps the
honest figures (:mod:`.figures`): the step each job stopped at, what was durable then, the hold.

:func:`handle` applies one input to a :class:`SagaRecord` (which is what the coordinator
stores in KV) and returns the commands it implies. Every command carries an idempotency key
(``<saga>/<node|job>/<action>``) and is issued at most once per saga; :func:`pending`
re-derives what a restarted coordinator must send again.

This file holds the transitions only (the vocabulary is in :mod:`.inputs`, the record in
:mod:`.record`, the battery rules in :mod:`.budget`); it stays one file over 450 lines
because every transition reads and changes the same record from state to state, and split
by state the parts would call each other both ways.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Literal

from powerguard.schemas import HoldPolicy, SagaState, command_key

from . import battery, killpower
from . import budget as rules
from .inputs import Ack, Command, CommandKind, Input, NodeReport, Power, Resumed, Tick, UpsReport
from .policy import Policy
from .record import (  # noqa: F401  (the record model, re-exported: saga.SagaRecord, ...)
    BatteryFigures,
    CkptRound,
    JobPlan,
    NodePlan,
    SagaRecord,
    Transition,
    UpsOffPlan,
    UpsView,
    _strength,
    meets,
)
from .topology import JobInfo, Topology

S = SagaState


# --------------------------------------------------------------------------- the machine
def start(
    *,
    saga_id: str,
    topo: Topology,
    ups: dict[str, UpsView],
    jobs: dict[str, JobInfo],
    now: float,
    trace: tuple[str, str] | None = None,
    hold_policy: HoldPolicy = "checkpoint-at-stop",
    held: frozenset[str] = frozenset(),
    shutdown_need: dict[str, float] | None = None,
    drill: bool = False,
) -> SagaRecord:
    """A new saga for the nodes at risk now that no other saga holds (``held``; call only when
    some node is at risk). ``shutdown_need``: the node groups' measured shutdowns so far.
    ``drill``: the views are a drill's (``powerguard drill``): every power and job command of
    the saga is dry-run, for its whole life.

    ``trace`` is (trace id, span id) of the event that started it: the outage joins that trace."""
    rec = SagaRecord(
        saga_id=saga_id,
        site=topo.site,
        created_at=now,
        updated_at=now,
        ups={u: v.model_copy(deep=True) for u, v in ups.items()},
        shutdown_need=dict(shutdown_need or {}),
    )
    if trace is not None:
        rec.trace_id, rec.parent_span_id = trace
    rec.history.append(Transition(state=S.DETECTED, at=now, reason=f"on battery: {', '.join(rec.on_battery)}"))
    rec.at_risk = [n for n in topo.nodes_at_risk(rec.on_battery) if n not in held]
    rec.drill = drill
    _join(rec, rec.at_risk, jobs, hold_policy)
    return rec


def handle(
    rec: SagaRecord,
    inputs: Input | Sequence[Input],
    *,
    now: float,
    topo: Topology,
    policy: Policy,
    jobs: dict[str, JobInfo] | Callable[[], dict[str, JobInfo]] | None = None,
    held: frozenset[str] = frozenset(),
) -> list[Command]:
    """Apply one input (or a batch of inputs, then advance once); return the new commands,
    never one already issued in this saga.

    ``jobs`` (the current agent registry, or a function returning it, called only when needed)
    lets nodes that become at risk mid-saga join it; ``held``: nodes other open sagas hold
    (never joined by this one).
    """
    if rec.terminal:
        return []
    out: list[Command] = []
    for inp in inputs if isinstance(inputs, Sequence) else (inputs,):
        match inp:
            case Power():
                _observe(rec, inp, now)
                _settle(rec, now, topo, policy, jobs, out, held)  # power readings count one by one, in order
            case Ack():
                _ack(rec, inp, now, policy.require_durability)
            case NodeReport():
                _node_report(rec, inp, now)
            case UpsReport():
                told = rec.ups_off.get(inp.ups)
                if told is not None and told.done_at is None and told.error is None:
                    if inp.ok:
                        told.done_at = now
                    else:
                        told.error = inp.detail or "failed"
            case Resumed():
                plan = rec.jobs.get(inp.job) or rec.carried.get(inp.job)
                if plan is not None and rec.state == S.RESTORING and plan.resumed_at is None:
                    plan.resumed_at, plan.resumed_step = now, inp.step
            case Tick():
                pass
        if rec.terminal:
            break
    _settle(rec, now, topo, policy, jobs, out, held)
    rec.updated_at = now
    return out


JobsArg = dict[str, JobInfo] | Callable[[], dict[str, JobInfo]] | None


def _jobs_now(jobs: JobsArg) -> dict[str, JobInfo]:
    return (jobs() if callable(jobs) else jobs) or {}


def _settle(
    rec: SagaRecord, now: float, topo: Topology, policy: Policy, jobs, out: list[Command], held: frozenset[str]
) -> None:
    if rec.state.before_shutdown:
        risk = [n for n in topo.nodes_at_risk(rec.on_battery) if n not in held]
        new_nodes = [n for n in risk if n not in rec.nodes]
        rec.at_risk = risk
        if new_nodes and jobs is not None:
            _join(rec, new_nodes, jobs() if callable(jobs) else jobs, policy.hold_policy)
    _record_durable(rec, out)  # before the commands this input leads to (a job stop, then its restart)
    _advance(rec, now, topo, policy, out, jobs)
    _record_durable(rec, out)  # a round the advance settled


def _record_durable(rec: SagaRecord, out: list[Command]) -> None:
    """Announce each job's newest step every rank made durable, once per step: a restore never
    picks an older one, and takes the copy the acks named."""
    for job, plan in rec.jobs.items():
        step = plan.durable_step
        if step is not None and (plan.recorded_step is None or step > plan.recorded_step):
            plan.recorded_step = step
            _issue(rec, out, "ckpt_recorded", job, f"recorded.{step}", step=step, commit=plan.durable_commit)


def _join(rec: SagaRecord, nodes: list[str], jobs: dict[str, JobInfo], default_policy: HoldPolicy) -> None:
    for n in nodes:
        rec.nodes.setdefault(n, NodePlan(node=n))
    for name, info in sorted(jobs.items()):
        if name in rec.jobs or not (info.nodes & set(nodes)):
            continue
        rec.jobs[name] = JobPlan(
            job=name,
            world_size=info.world_size,
            ranks=dict(info.ranks),
            step_at_detection=info.step,
            request_id=command_key(rec.saga_id, name, "ckpt"),
            hold_policy=info.hold_policy or default_policy,
        )


def observe(views: dict[str, UpsView], p: Power, now: float) -> None:
    """Fold one reading into a table of UPS views (the site's real or drill table, and each
    saga's own copy). Low battery counts only on battery; a drill flag only while on battery."""
    view = views.setdefault(p.ups, UpsView(since=now))
    if view.on_battery != p.on_battery:
        view.since = now
        if p.on_battery:  # a new discharge: its own samples, and the UPS's first word on it
            view.samples, view.start_charge_pct, view.start_runtime_s = [], p.charge_pct, p.runtime_s
    view.on_battery = p.on_battery
    if p.runtime_s is not None:
        view.runtime_s = p.runtime_s
    if p.charge_pct is not None:
        view.charge_pct = p.charge_pct
    if p.load_pct is not None:
        view.load_pct = p.load_pct
    if p.on_battery:
        battery.add_sample(view.samples, now, p.charge_pct, p.load_pct)
        if view.start_charge_pct is None:
            view.start_charge_pct = p.charge_pct
        if view.start_runtime_s is None:
            view.start_runtime_s = p.runtime_s
    view.low_battery = p.low_battery and p.on_battery
    view.fsd = p.fsd
    view.drill = p.drill and p.on_battery


def _observe(rec: SagaRecord, p: Power, now: float) -> None:
    view = rec.ups.get(p.ups)
    if view is not None and view.on_battery and not p.on_battery and not view.drill:
        loads = [s[2] for s in view.samples if s[2] >= 0]
        rec.battery[p.ups] = BatteryFigures(
            predicted_s=view.start_runtime_s,
            observed_s=battery.observed_runtime(view.samples, view.start_charge_pct),
            load_pct=round(sum(loads) / len(loads), 1) if loads else None,
            on_battery_s=round(now - view.since, 3),
        )
    observe(rec.ups, p, now)


def _ack(rec: SagaRecord, a: Ack, now: float, require: str = "local") -> None:
    plan = rec.jobs.get(a.job)
    if plan is None or not 0 <= a.rank < plan.world_size or a.request_id is None:
        return  # an ack must answer a request this saga issued
    rnd: CkptRound | None = plan if a.request_id == plan.request_id else None
    for other in (plan.final, plan.hold):
        if rnd is None and other is not None and a.request_id == other.request_id:
            rnd = other
    if rnd is None or rnd.requested_at is None or rnd.settled_at is not None:
        return  # not ours, not sent yet, or late: the deadline decided already
    rnd.require = require
    if a.ok:
        rnd.acked[a.rank] = a.step
        rnd.failed.pop(a.rank, None)
        if a.commit is not None:
            rnd.commit = a.commit
        if _strength(a.durability) >= _strength(rnd.levels.get(a.rank, "local")):
            rnd.levels[a.rank] = a.durability  # a later ack raises the level (replicas, the remote copy)
    elif a.rank not in rnd.acked:
        rnd.failed[a.rank] = a.error or "failed"
    if rnd.answered:
        if rnd is plan.hold:
            _settle_hold(plan, now)
        rnd.settled_at = now


def _node_report(rec: SagaRecord, r: NodeReport, now: float) -> None:
    plan = rec.nodes.get(r.node)
    if plan is None:
        return
    if plan.power_on_at is None and plan.off_at is not None:  # down, and not yet powered on by the saga
        if r.state == "ready":  # someone powered it on by hand: it has power again
            plan.in_doubt = f"reported on ({r.detail or 'no detail'}): powered on by hand?"
            return
        if r.state == "failed_off":
            plan.in_doubt = f"a later off failed ({r.detail or 'no detail'}): its power state is unknown"
            return
        if r.state == "off":
            plan.in_doubt = None
    if r.state in ("off", "failed_off") and plan.shutdown_at is not None and plan.off_at is None:
        plan.off_at = now
        plan.error = (
            (r.detail or "off failed") if r.state == "failed_off" else None
        )  # a failure without a word still failed
    elif r.state == "off" and plan.error is not None and plan.shutdown_at is not None and plan.power_on_at is None:
        plan.error = None  # off after all (the outlets on a retry, a later read-back): a fact
    elif r.state == "off" and plan.power_on_at is not None and plan.ready_at is None:
        plan.waiting = r.detail  # e.g. "power-on ramp: starts in 42.0s"
    elif r.state == "ready" and plan.power_on_at is not None and plan.ready_at is None:
        plan.ready_at, plan.waiting = now, None
    elif r.state == "failed_on" and plan.power_on_at is not None:
        plan.error = r.detail or "power on failed"


def site_need_s(rec: SagaRecord, topo: Topology, policy: Policy) -> float:
    """What one outage needs of a battery: the slowest measured power checkpoint, what the
    shutdown of the saga's nodes needs (measured, or the reserve) and the margin."""
    took = [d for p in rec.jobs.values() if (d := p.duration_s) is not None]
    groups = {topo.group_key(topo.feeds[n]) for n in rec.nodes if n in topo.feeds}
    return (max(took) if took else 0.0) + rules.groups_need_s(rec.supply, topo, policy, groups) + policy.margin_s


def _budget_deadline(rec: SagaRecord, now: float, topo: Topology, policy: Policy) -> float:
    return now + rules.budget_s(rec.supply, topo, policy)


def _final_estimate_s(rec: SagaRecord) -> float | None:
    """How long a final checkpoint will take: the slowest job's measured power checkpoint."""
    known = [d for p in _final_candidates(rec) if (d := p.duration_s) is not None]
    return max(known) if known else None


def _final_candidates(rec: SagaRecord) -> list[JobPlan]:
    at_risk = set(rec.at_risk)
    return [
        p
        for _, p in sorted(rec.jobs.items())
        if p.hold_policy == "checkpoint-at-stop" and p.final is None and set(p.ranks.values()) & at_risk
    ]


def _final_trigger(rec: SagaRecord, topo: Topology, policy: Policy) -> str | None:
    """Stop early enough that a final checkpoint fits before the shutdown reserve: when the
    budget left falls to ``final_ckpt_factor`` times the measured checkpoint duration."""
    runtime, estimate = rules.runtime(rec.supply, topo), _final_estimate_s(rec)
    if runtime is None or estimate is None:
        return None
    left = runtime - policy.shutdown_reserve_s - policy.margin_s
    if left <= policy.final_ckpt_factor * estimate:
        return (
            f"runtime {runtime:.0f}s: {max(0.0, left):.1f}s left before the {policy.shutdown_reserve_s:.0f}s shutdown "
            f"reserve, time for the final checkpoint (~{estimate:.1f}s)"
        )
    return None


def _shutdown_trigger(rec: SagaRecord, now: float, topo: Topology, policy: Policy) -> str | None:
    if reason := rules.low_battery(rec.supply, topo):
        return reason
    runtime = rules.runtime(rec.supply, topo)
    if runtime is not None and runtime < policy.shutdown_reserve_s:
        return f"runtime {runtime:.0f}s below the {policy.shutdown_reserve_s:.0f}s shutdown reserve"
    if now - rec.created_at >= policy.max_on_battery_s:
        return f"on battery for {policy.max_on_battery_s:.0f}s (max_on_battery_s)"
    return None


def _set(rec: SagaRecord, state: SagaState, now: float, reason: str | None = None) -> None:
    rec.state = state
    rec.reason = reason
    rec.history.append(Transition(state=state, at=now, reason=reason))


def _issue(rec: SagaRecord, out: list[Command], kind: CommandKind, target: str, action: str, **args: Any) -> None:
    _emit(rec, out, Command(kind=kind, key=command_key(rec.saga_id, target, action), target=target, args=args))


def _advance(rec: SagaRecord, now: float, topo: Topology, policy: Policy, out: list[Command], jobs: JobsArg) -> None:
    for _ in range(16):  # a bounded number of steps per input; each step changes state or stops
        before = rec.state
        _step(rec, now, topo, policy, out, jobs)
        if rec.state == before:
            return


def _step(rec: SagaRecord, now: float, topo: Topology, policy: Policy, out: list[Command], jobs: JobsArg) -> None:
    state = rec.state
    if state.before_shutdown and not rec.at_risk:
        _back_before_shutdown(rec, now, policy, out, jobs)
        return
    if state.before_shutdown and rec.back_before_shutdown_at is not None:
        rec.back_before_shutdown_at = None  # power failed again while the saga waited to hear its jobs
    if state == S.DETECTED or any(j.requested_at is None for j in rec.jobs.values()):
        _request_checkpoints(rec, now, topo, policy, out)
        if not state.checkpoint_deadline:
            _set(rec, S.CHECKPOINTING, now, f"{len(rec.jobs)} job(s) on {len(rec.at_risk)} node(s) at risk")
            return
    if state == S.CHECKPOINTING:
        if _settle_rounds(rec, now, topo, policy, out):
            if retried := _retry_rounds(rec, now, topo, policy, out):
                _set(rec, S.CHECKPOINTING, now, retried)
                return
            missing = {j: p.missing for j, p in rec.jobs.items() if p.missing}
            if missing:
                _set(
                    rec,
                    S.PARTIAL,
                    now,
                    "missing acks: "
                    + "; ".join(f"{j} ranks {','.join(map(str, r))}" for j, r in sorted(missing.items())),
                )
            else:
                _set(rec, S.CHECKPOINTED, now, "every rank acked" if rec.jobs else "no job on the nodes at risk")
        return
    if state in (S.CHECKPOINTED, S.PARTIAL):
        _set(rec, S.HOLDING, now, "holding while power may return")
        return
    if state == S.HOLDING:
        reason = _shutdown_trigger(rec, now, topo, policy) or _final_trigger(rec, topo, policy)
        if reason:
            _stop(rec, now, reason, topo, policy, out, jobs)
        else:
            _hold_checkpoints(rec, now, topo, policy, out)
        return
    if state == S.FINAL_CHECKPOINT:
        if _settle_rounds(rec, now, topo, policy, out):
            _note_finals(rec)
            _shutdown(rec, now, rec.stop_reason or "stop", out, jobs)
        return
    if state == S.SHUTTING_DOWN:
        shut = [rec.nodes[n] for n in rec.nodes if rec.nodes[n].shutdown_at is not None]
        _retry_offs(rec, now, topo, policy, shut, out)
        failed = [p for p in shut if p.off_at is not None and p.error is not None]
        late = [p.node for p in shut if p.off_at is None]
        timed_out = now - (rec.shutdown_started_at or now) >= policy.shutdown_timeout_s
        if late and not timed_out:
            return
        why = [f"off failed on {p.node} ({p.error}): its power state is unknown" for p in failed]
        if late:
            why.append(f"no off report from {', '.join(late)} within {policy.shutdown_timeout_s:.0f}s")
        if why:
            off = [p.node for p in shut if p.off_at is not None and p.error is None]
            _set(rec, S.PARTLY_DOWN, now, "; ".join(why) + f"; off: {', '.join(off) or 'none'}")
        else:
            _set(rec, S.DOWN, now, "every node at risk is off")
        return
    if state == S.PARTLY_DOWN and all(
        p.off_at is not None and p.error is None for p in rec.nodes.values() if p.shutdown_at is not None
    ):
        _set(rec, S.DOWN, now, "every node at risk is off (after a failed off)")
        return
    if state.down:
        _ups_off(rec, now, topo, policy, out)
        feeds = {u for n, p in rec.nodes.items() if p.shutdown_at is not None for u in topo.feeds.get(n, ())}
        views = [rec.ups.get(u, UpsView()) for u in feeds]
        if views and all(not v.on_battery for v in views):
            back = max(v.since for v in views)
            rec.power_back_at = back
            charged = all(v.charge_pct is None or v.charge_pct >= policy.min_restart_charge_pct for v in views)
            cycled = all(now >= t.told_at + t.delay_s + policy.ups_off_return_s for t in rec.ups_off.values())
            if now - back >= policy.restore_stable_s and charged and cycled:
                _restore(rec, now, out)
        return
    if state == S.RESTORING:
        for name, plan in _restartable(rec):
            nodes = set(plan.ranks.values())
            powered = [rec.nodes[n] for n in nodes if n in rec.nodes and rec.nodes[n].power_on_at is not None]
            if all(p.ready_at is not None for p in powered) and plan.restart_at is None:
                plan.restart_at = now
                _emit(rec, out, _job_command(rec, "job_restart", name))
        nodes_ready = all(p.ready_at is not None for p in rec.nodes.values() if p.power_on_at is not None)
        if nodes_ready and all(p.resumed_at is not None for _, p in _restartable(rec)):
            _set(rec, S.RESUMED, now, "every job resumed")
        elif now - (rec.restore_started_at or now) >= policy.restore_timeout_s:
            late = [p.node for p in rec.nodes.values() if p.power_on_at is not None and p.ready_at is None]
            stuck = [j for j, p in _restartable(rec) if p.resumed_at is None]
            _set(rec, S.FAILED, now, f"restore timed out: nodes not ready {late}, jobs not resumed {stuck}")
        return
    if state == S.RESUMED:
        _set(rec, S.DONE, now, "outage handled")
        for name, plan in sorted(rec.jobs.items()):
            if plan.paused:  # a safety net: nothing of this outage may keep a rank waiting
                _issue(rec, out, "release", name, "release")


def _back_before_shutdown(rec: SagaRecord, now: float, policy: Policy, out: list[Command], jobs: JobsArg) -> None:
    """Power returned before any shutdown. Paused ranks are released at once. The saga ends
    ``cancelled`` once every job it protects has been heard from (a heartbeat) since; a job not
    heard for ``job_silence_s`` died with the power (the site lost power before its shutdown: a
    blackout, a runtime estimate that was wrong) and is restarted from its newest durable
    checkpoint (``restoring``). A job no longer registered (its ranks deregistered: it ended) is
    not waited for."""
    if rec.back_before_shutdown_at is None:
        rec.back_before_shutdown_at = now
        for name, plan in sorted(rec.jobs.items()):
            if plan.paused:
                _issue(rec, out, "release", name, "release")
    since = rec.back_before_shutdown_at
    live = _jobs_now(jobs) if rec.jobs else {}
    silent = sorted(
        name
        for name in rec.jobs
        if (info := live.get(name)) is not None and info.heard_at is not None and info.heard_at < since
    )
    if not silent:
        _set(rec, S.CANCELLED, now, "power back before shutdown")
        return
    if now - since < policy.job_silence_s:
        return
    for name, plan in rec.jobs.items():
        plan.kept_running = name not in silent
    rec.restore_started_at = now
    _set(
        rec,
        S.RESTORING,
        now,
        f"power back before shutdown, but job(s) {', '.join(silent)} not heard from in {policy.job_silence_s:.0f}s: "
        "they lost their power; restarting from the newest durable checkpoint",
    )


def _ups_off(rec: SagaRecord, now: float, topo: Topology, policy: Policy, out: list[Command]) -> None:
    """Tell each UPS that :mod:`.killpower` finds due to cut its output and return."""
    if not policy.ups_off:
        return
    decision = killpower.decide(rec, now=now, topo=topo, policy=policy)
    for node in decision.shutdown:  # the last stage: the site's storage, then network, first
        _shut_down_load(rec, node, now, out)
    for due in decision.due:
        rec.ups_off[due.ups] = UpsOffPlan(told_at=now, delay_s=due.delay_s, reason=due.reason, nodes=list(due.nodes))
        _emit(rec, out, _ups_command(rec, due.ups))
        for node in due.management:  # PowerGuard's own hosts last: down within the UPS's delay
            _shut_down_load(rec, node, now, out)


def _shut_down_load(rec: SagaRecord, node: str, now: float, out: list[Command]) -> None:
    plan = rec.nodes.setdefault(node, NodePlan(node=node))
    if plan.shutdown_at is None:
        plan.shutdown_at = now
        _emit(rec, out, _node_command(rec, "shutdown", node, {}))


def _ups_command(rec: SagaRecord, ups: str) -> Command:
    told = rec.ups_off[ups]
    key = command_key(rec.saga_id, f"ups:{ups}", "output_off")
    args = {"delay_s": told.delay_s, "reason": told.reason, "nodes": told.nodes}
    return Command(kind="ups_off", key=key, target=ups, args=args)


def _restartable(rec: SagaRecord) -> list[tuple[str, JobPlan]]:
    """The jobs this saga restarts: its own (but those that kept running through a power return
    before the shutdown) and those carried from a saga it superseded."""
    return sorted((k, p) for k, p in {**rec.carried, **rec.jobs}.items() if not p.kept_running)


def _retry_rounds(rec: SagaRecord, now: float, topo: Topology, policy: Policy, out: list[Command]) -> str | None:
    """A new round for each job whose power checkpoint failed (a rank reported an error, or
    some rank did not answer in time) while retries and the battery budget are left; returns
    the reason to record, or None when nothing is retried."""
    budget = rules.budget_s(rec.supply, topo, policy)
    retried = []
    for name, plan in sorted(rec.jobs.items()):
        if plan.settled_at is None or not plan.missing or plan.attempt > policy.ckpt_retries:
            continue
        took = plan.settled_at - (plan.requested_at if plan.requested_at is not None else plan.settled_at)
        if budget <= max(1.0, 0.0 if plan.failed else took):
            continue  # no battery for another round (silent ranks get one only as long as the last)
        why = "; ".join(f"rank {r}: {e}" for r, e in sorted(plan.failed.items())) or (
            f"ranks {','.join(map(str, plan.missing))} did not ack"
        )
        plan.attempt += 1
        plan.request_id = command_key(rec.saga_id, name, _round_action(plan.attempt))
        plan.acked, plan.failed, plan.levels, plan.settled_at = {}, {}, {}, None
        plan.requested_at, plan.deadline, plan.told_deadline = now, now + budget, now + budget
        _emit(rec, out, ckpt_command(rec, plan, final=False, policy=policy))
        retried.append(f"{name} (attempt {plan.attempt} of {policy.ckpt_retries + 1}: {why})")
    return f"power checkpoint retried: {'; '.join(retried)}" if retried else None


def _round_action(attempt: int) -> str:
    return "ckpt" if attempt == 1 else f"ckpt.{attempt}"


def _retry_offs(
    rec: SagaRecord, now: float, topo: Topology, policy: Policy, shut: list[NodePlan], out: list[Command]
) -> None:
    """Command a node whose off failed off again (power-control falls back to the outlets on a
    retry) while retries are left and the battery has not run out."""
    runtime = rules.runtime(rec.supply, topo)
    if runtime is not None and runtime <= policy.margin_s:
        return
    by_node = None
    for p in shut:
        tries = p.off_retry or 0
        if p.off_at is None or p.error is None or tries >= policy.off_retries:
            continue
        if not all(rec.ups.get(u, UpsView()).on_battery for u in topo.feeds.get(p.node, ())):
            continue  # mains is back for it: the restore powers it on, whatever its state
        p.off_retry, p.off_at = tries + 1, None
        by_node = rec.jobs_by_node() if by_node is None else by_node
        _emit(rec, out, _node_command(rec, "shutdown", p.node, by_node))


def supersede(old: SagaRecord, new: SagaRecord, now: float) -> None:
    """Power failed again while ``old`` restored: ``new`` protects the nodes at risk and carries
    what ``old`` had yet to restore (nodes not ready, jobs not resumed); ``old`` ends failed."""
    for node, p in sorted(old.nodes.items()):
        if p.shutdown_at is None or p.ready_at is not None or node in new.nodes:
            continue
        new.nodes[node] = NodePlan(
            node=node, shutdown_at=p.shutdown_at, off_at=p.off_at or now, error=p.error or f"carried from {old.saga_id}"
        )
    for name, plan in sorted({**old.carried, **old.jobs}.items()):
        if plan.resumed_at is None and not plan.kept_running and name not in new.jobs:
            new.carried[name] = plan.model_copy(update={"restart_at": None})
    old.superseded_by = new.saga_id
    carried = sorted(new.carried)
    _set(
        old,
        S.FAILED,
        now,
        f"superseded by {new.saga_id}: power failed again during the restore"
        + (f"; it restores {', '.join(carried)}" if carried else ""),
    )
    old.updated_at = now


def give_way(drill: SagaRecord, real: SagaRecord, now: float) -> list[Command]:
    """A real outage's saga holds nodes or jobs of a drill: the drill ends ``cancelled``, its
    paused ranks released (the real saga asks them for what it needs itself; a rank leaves a
    pause only once every saga that paused it released it). Nothing the drill did was real."""
    out: list[Command] = []
    for name, plan in sorted(drill.jobs.items()):
        if plan.paused:
            _issue(drill, out, "release", name, "release")
    _set(drill, S.CANCELLED, now, f"a real outage (saga {real.saga_id}) holds its nodes or jobs: the drill ends")
    drill.updated_at = now
    return out


def held_by(rec: SagaRecord) -> set[str]:
    """The nodes a saga holds: at risk before its shutdown; shut down and not yet powered on after."""
    if rec.terminal:
        return set()
    if rec.state.before_shutdown:
        return set(rec.at_risk)
    return {n for n, p in rec.nodes.items() if p.shutdown_at is not None and p.power_on_at is None}


def _rounds(rec: SagaRecord) -> list[CkptRound]:
    """Every checkpoint round of the saga that was requested."""
    out: list[CkptRound] = []
    for _, plan in sorted(rec.jobs.items()):
        out += [r for r in (plan, plan.final) if r is not None and r.requested_at is not None]
    return out


DEADLINE_RESEND_S = 2.0  # a deadline shrunk by more than this is sent to the ranks again


def _settle_rounds(rec: SagaRecord, now: float, topo: Topology, policy: Policy, out: list[Command]) -> bool:
    """Shrink open deadlines to the battery budget (and tell the ranks: the request again,
    same request id, the new deadline), settle rounds that are answered or past their
    deadline; True when every round is settled."""
    budget = _budget_deadline(rec, now, topo, policy)  # the battery only ever shrinks a deadline
    open_rounds = [r for r in _rounds(rec) if r.settled_at is None]
    for plan in rec.jobs.values():
        if plan.settled_at is None and plan.deadline is not None and plan.requested_at is not None:
            plan.deadline = min(plan.deadline, budget)
        f = plan.final
        if f is not None and f.settled_at is None and f.deadline is not None:  # its own window (budget or margin)
            f.deadline = min(f.deadline, now + rules.final_window(rec.supply, topo, policy, plan.duration_s).seconds)
    for plan in rec.jobs.values():
        for final, r in ((False, plan), (True, plan.final)):
            if r is None or r.settled_at is not None or r.deadline is None or r.told_deadline is None:
                continue
            if r.deadline < r.told_deadline - DEADLINE_RESEND_S and now < r.deadline:
                r.told_deadline = r.deadline
                cmd = ckpt_command(rec, plan, final=final, policy=policy)
                _emit(rec, out, replace(cmd, key=f"{cmd.key}.deadline-{int(r.deadline * 1000)}"))
    deadlines = [r.deadline for r in open_rounds if r.deadline]
    rec.deadline = max(deadlines) if deadlines else rec.deadline
    for r in open_rounds:
        if r.answered or now >= (r.deadline or now):
            r.settled_at = now
    return all(r.settled_at is not None for r in _rounds(rec))


def _hold_checkpoints(rec: SagaRecord, now: float, topo: Topology, policy: Policy, out: list[Command]) -> None:
    """While holding, a checkpoint of every ``checkpoint-at-stop`` job at risk every
    ``hold_checkpoint_every_s`` (never more often than its measured power checkpoint allows at
    ``hold_checkpoint_max_share``), one round at a time, each within the battery budget: the
    training at risk at any moment stays bounded even when no final checkpoint can be taken."""
    if not policy.hold_checkpoint_every_s:
        return
    budget = rules.budget_s(rec.supply, topo, policy)
    for plan in _final_candidates(rec):
        h = plan.hold
        if h is not None and h.settled_at is None:
            if now >= (h.deadline or now):
                _settle_hold(plan, now)
                h.settled_at = now
            continue
        cost = plan.duration_s
        if cost is None or budget <= cost:  # no measured checkpoint of this outage, or no battery for one
            continue
        every = max(policy.hold_checkpoint_every_s, cost / policy.hold_checkpoint_max_share)
        last = h.requested_at if h is not None else plan.settled_at
        if last is None or now - last < every:
            continue
        plan.hold_rounds += 1
        plan.hold = CkptRound(
            request_id=command_key(rec.saga_id, plan.job, f"hold.{plan.hold_rounds}"),
            world_size=plan.world_size,
            requested_at=now,
            deadline=now + budget,
            told_deadline=now + budget,
        )
        _emit(rec, out, hold_command(rec, plan))


def _settle_hold(plan: JobPlan, now: float) -> None:
    """A hold round answered (or out of time): its step counts once every rank made it durable."""
    h = plan.hold
    if h is not None and not h.missing and h.step is not None and h.step >= (plan.hold_step or 0):
        plan.hold_step, plan.hold_commit = h.step, h.commit


def hold_command(rec: SagaRecord, plan: JobPlan) -> Command:
    """The request of a job's latest hold checkpoint (training goes on after it)."""
    h = plan.hold
    assert h is not None
    return Command(
        kind="ckpt_request",
        key=command_key(rec.saga_id, plan.job, f"hold.{plan.hold_rounds}"),
        target=plan.job,
        args={"request_id": h.request_id, "deadline": h.deadline, "reason": "hold", "then": "continue"},
    )


def ckpt_command(rec: SagaRecord, plan: JobPlan, *, final: bool, policy: Policy) -> Command:
    """The checkpoint request of a job's power (or final) round: one definition for sending and re-sending."""
    rnd = plan.final if final else plan
    assert rnd is not None
    then = "pause" if final or plan.hold_policy == "pause" else "continue"
    return Command(
        kind="ckpt_request",
        key=command_key(rec.saga_id, plan.job, "final" if final else _round_action(plan.attempt)),
        target=plan.job,
        args={
            "request_id": rnd.request_id,
            "deadline": rnd.deadline,
            "reason": "final" if final else "power",
            "then": then,
            "pause_max_s": policy.pause_max_s if then == "pause" else None,
        },
    )


def _emit(rec: SagaRecord, out: list[Command], cmd: Command) -> None:
    if cmd.key not in rec.issued:
        rec.issued.add(cmd.key)
        out.append(cmd)


def _request_checkpoints(rec: SagaRecord, now: float, topo: Topology, policy: Policy, out: list[Command]) -> None:
    deadline = _budget_deadline(rec, now, topo, policy)
    rec.deadline = deadline
    for _, plan in sorted(rec.jobs.items()):
        if plan.requested_at is None:
            plan.requested_at, plan.deadline, plan.told_deadline = now, deadline, deadline
            _emit(rec, out, ckpt_command(rec, plan, final=False, policy=policy))


def _stop(
    rec: SagaRecord, now: float, reason: str, topo: Topology, policy: Policy, out: list[Command], jobs: JobsArg
) -> None:
    """The saga decided to shut down: a final checkpoint first where the policy asks for one and
    the battery allows it, else the shutdown at once."""
    rec.stop_reason, rec.stop_decided_at = reason, now
    asked, skipped, longest = 0, [], 0.0
    for plan in _final_candidates(rec):
        window = rules.final_window(rec.supply, topo, policy, plan.duration_s)
        if window.why_skipped is not None:
            why = window.why_skipped if reason in window.why_skipped else f"{window.why_skipped} ({reason})"
            plan.final_note = f"skipped: {why}; stopped on {_newest_checkpoint(plan)}"
            skipped.append(plan.job)
            continue
        if window.from_margin:
            plan.final_note = None  # its note comes with its result; the stop reason says why it was taken
            reason_margin = f"final checkpoint within {window.seconds:.1f}s of the runtime's margin"
            if reason_margin not in (rec.stop_reason or ""):
                rec.stop_reason = f"{rec.stop_reason}; {reason_margin}"
        plan.final = CkptRound(
            request_id=command_key(rec.saga_id, plan.job, "final"),
            world_size=plan.world_size,
            requested_at=now,
            deadline=now + window.seconds,
            told_deadline=now + window.seconds,
        )
        _emit(rec, out, ckpt_command(rec, plan, final=True, policy=policy))
        asked, longest = asked + 1, max(longest, window.seconds)
    if asked:
        rec.deadline = now + longest
        _set(
            rec, S.FINAL_CHECKPOINT, now, f"{rec.stop_reason}; final checkpoint of {asked} job(s) within {longest:.1f}s"
        )
    else:
        _shutdown(
            rec, now, reason + (f"; final checkpoint skipped: {', '.join(skipped)}" if skipped else ""), out, jobs
        )


def _newest_checkpoint(plan: JobPlan) -> str:
    """What a job stopped without its final checkpoint restarts from, in words."""
    if plan.hold_step is not None and (plan.step is None or plan.hold_step > plan.step):
        return f"its hold checkpoint of step {plan.hold_step}"
    return "the power checkpoint"


def _note_finals(rec: SagaRecord) -> None:
    for plan in rec.jobs.values():
        f = plan.final
        if f is None or plan.final_note is not None:
            continue
        if f.complete:
            plan.final_note = f"committed at step {f.step}"
        else:
            why = "; ".join(f"rank {r}: {e}" for r, e in sorted(f.failed.items()))
            late = [r for r in f.missing if r not in f.failed]
            if late:
                why = "; ".join(filter(None, [why, f"ranks {','.join(map(str, late))} did not ack by the deadline"]))
            plan.final_note = f"failed ({why}); stopped on {_newest_checkpoint(plan)}"


def _record_stop(rec: SagaRecord, now: float, jobs: JobsArg) -> None:
    """Where each job is when it is told to stop: the honest start of the work-lost figures."""
    rec.ups_at_stop = {u: rec.ups[u].model_copy() for u in rec.on_battery}
    info = None
    for name, plan in sorted(rec.jobs.items()):
        plan.stopped_at = now
        if plan.final is not None and plan.final.complete:
            plan.stop_step, plan.stop_step_exact = plan.final.step, True  # ranks wait at the final step
        elif plan.hold_policy == "pause" and plan.complete:
            plan.stop_step, plan.stop_step_exact = plan.step, True  # ranks wait at the power checkpoint
        else:
            info = _jobs_now(jobs) if info is None else info
            seen = [plan.step, plan.final.step if plan.final else None, plan.hold_step, plan.step_at_detection]
            if name in info:
                seen.append(info[name].step)
            known = [x for x in seen if x is not None]
            plan.stop_step, plan.stop_step_exact = (max(known) if known else None), False


def _shutdown(rec: SagaRecord, now: float, reason: str, out: list[Command], jobs: JobsArg = None) -> None:
    if rec.stop_decided_at is None:
        rec.stop_reason, rec.stop_decided_at = reason, now
    _record_stop(rec, now, jobs)
    rec.shutdown_reason, rec.shutdown_started_at = reason, now
    _set(rec, S.SHUTTING_DOWN, now, reason)
    targets = set(rec.at_risk)
    for name, plan in sorted(rec.jobs.items()):
        if set(plan.ranks.values()) & targets:
            _emit(rec, out, _job_command(rec, "job_stop", name))
    by_node = rec.jobs_by_node()
    for node in sorted(targets):
        rec.nodes[node].shutdown_at = now
        _emit(rec, out, _node_command(rec, "shutdown", node, by_node))
    if not targets:
        _set(rec, S.DOWN, now, "no node to shut down")


def _restore(rec: SagaRecord, now: float, out: list[Command]) -> None:
    rec.restore_started_at = now
    _set(rec, S.RESTORING, now, "power stable")
    for node, plan in sorted(rec.nodes.items()):
        if plan.shutdown_at is not None:
            plan.power_on_at = now
            _emit(rec, out, _node_command(rec, "power_on", node))


def _job_command(rec: SagaRecord, kind: Literal["job_stop", "job_restart"], job: str) -> Command:
    """The stop or restart of a job on all its nodes: one builder for the first send and for
    every re-send by :func:`pending`, so the two never differ."""
    action = "stop" if kind == "job_stop" else "restart"
    nodes = sorted(set((rec.jobs.get(job) or rec.carried[job]).ranks.values()))
    return Command(kind=kind, key=command_key(rec.saga_id, job, action), target=job, args={"nodes": nodes})


def _node_command(
    rec: SagaRecord, kind: Literal["shutdown", "power_on"], node: str, by_node: dict[str, list[str]] | None = None
) -> Command:
    """A node's shutdown (with its jobs and the saga's reason) or power-on."""
    key = command_key(rec.saga_id, node, kind)
    if kind == "power_on":
        return Command(kind=kind, key=key, target=node)
    jobs = (by_node if by_node is not None else rec.jobs_by_node()).get(node, [])
    args: dict[str, Any] = {"jobs": jobs, "reason": rec.shutdown_reason}
    retry = rec.nodes[node].off_retry if node in rec.nodes else None
    if retry:  # the off failed before: a new key, and power-control may fall back to the outlets
        key, args["retry"] = f"{key}.r{retry}", retry
    return Command(kind=kind, key=key, target=node, args=args)


def pending(rec: SagaRecord, policy: Policy) -> list[Command]:
    """Commands of the current phase whose result has not arrived: what a restarted
    coordinator sends again (receivers deduplicate by idempotency key). Built by the same
    functions as the first send."""
    out: list[Command] = []
    if rec.state.checkpoint_deadline:
        for _, p in sorted(rec.jobs.items()):
            if p.requested_at is not None and p.settled_at is None:
                out.append(ckpt_command(rec, p, final=False, policy=policy))
            if p.final is not None and p.final.settled_at is None:
                out.append(ckpt_command(rec, p, final=True, policy=policy))
    elif rec.state == S.HOLDING:
        out += [hold_command(rec, p) for _, p in sorted(rec.jobs.items()) if p.hold and p.hold.settled_at is None]
    elif rec.state == S.SHUTTING_DOWN:
        for name in sorted(rec.jobs):
            if command_key(rec.saga_id, name, "stop") in rec.issued:
                out.append(_job_command(rec, "job_stop", name))
        by_node = rec.jobs_by_node()
        for node, p in sorted(rec.nodes.items()):
            if p.shutdown_at is not None and p.off_at is None:
                out.append(_node_command(rec, "shutdown", node, by_node))
    if rec.state.down:
        out += [_ups_command(rec, u) for u, t in sorted(rec.ups_off.items()) if t.done_at is None and t.error is None]
        by_node = rec.jobs_by_node()
        for node, p in sorted(rec.nodes.items()):  # the last stage's loads (and any off not reported)
            if p.shutdown_at is not None and p.off_at is None:
                out.append(_node_command(rec, "shutdown", node, by_node))
    elif rec.state == S.RESTORING:
        for node, p in sorted(rec.nodes.items()):
            if p.power_on_at is not None and p.ready_at is None:
                out.append(_node_command(rec, "power_on", node))
        for name, p in _restartable(rec):
            if p.restart_at is not None and p.resumed_at is None:
                out.append(_job_command(rec, "job_restart", name))
    return out
