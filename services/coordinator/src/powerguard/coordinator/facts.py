"""What each input tells a saga, folded into its record: a UPS reading, a rank's ack, a
node's state, a UPS's answer, a job resumed. Facts only: no command is issued here (the
state handlers in :mod:`.states` decide what the facts imply)."""

from __future__ import annotations

from powerguard.schemas import SagaState

from . import battery
from .inputs import Ack, Input, NodeReport, Power, Resumed, UpsReport
from .record import BatteryFigures, CkptRound, SagaRecord, UpsView
from .rounds import settle_hold

S = SagaState


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


def apply(rec: SagaRecord, inp: Input, now: float, *, require: str = "local") -> None:
    """Fold one input other than a reading (readings go through :func:`power`, which the saga
    settles one by one) into the record."""
    match inp:
        case Ack():
            ack(rec, inp, now, require)
        case NodeReport():
            node_report(rec, inp, now)
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


def power(rec: SagaRecord, p: Power, now: float) -> None:
    """A UPS reading: the saga's view of it, and the battery's figures when its discharge ended."""
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


def ack(rec: SagaRecord, a: Ack, now: float, require: str = "local") -> None:
    plan = rec.jobs.get(a.job)
    if plan is None or not 0 <= a.rank < plan.world_size or a.request_id is None:
        return  # an ack must answer a request this saga issued
    rnd: CkptRound | None = plan if a.request_id == plan.request_id else None
    for other in (plan.final, plan.hold):
        if rnd is None and other is not None and a.request_id == other.request_id:
            rnd = other
    if rnd is None or rnd.requested_at is None or rnd.settled_at is not None:
        return  # not ours, not sent yet, or late: the deadline decided already
    rnd.requiring(require)
    if a.ok:
        if a.commit is not None:
            rnd.commit = a.commit
        for rank in _ranks(a, plan.world_size):
            rnd.take(rank, a.step, a.durability)  # a later ack raises the level (replicas, the remote copy)
    elif a.rank not in rnd.acked:
        rnd.failed[a.rank] = a.error or "failed"
    if rnd.answered:
        if rnd is plan.hold:
            settle_hold(plan)
        rnd.settled_at = now


def _ranks(a: Ack, world_size: int) -> range | tuple[int, ...] | list[int]:
    """The ranks an ack speaks for: its own, or the spans rank 0 named (within the job's world)."""
    if a.ranks is None:
        return (a.rank,)
    if len(a.ranks) == 1:
        return range(a.ranks[0][0], min(a.ranks[0][1], world_size - 1) + 1)
    return [r for first, last in a.ranks for r in range(first, min(last, world_size - 1) + 1)]


def node_report(rec: SagaRecord, r: NodeReport, now: float) -> None:
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
