"""One handler per saga state: what the record's facts imply in that state (a transition, the
commands it causes). :data:`HANDLERS` is the dispatch table :func:`saga.handle` advances by;
each handler changes the state or leaves it (then the advance stops).

    detected -> checkpointing -> checkpointed | partial -> holding [-> final_checkpoint]
             -> shutting_down -> down | partly_down -> restoring -> resumed -> done
"""

from __future__ import annotations

from collections.abc import Callable

from powerguard.schemas import SagaState

from . import budget as rules
from . import killpower, rounds
from .commands import job_command, node_command, restartable, simple, ups_command
from .record import NodePlan, SagaRecord, UpsOffPlan, UpsView
from .turn import Turn, jobs_now, set_state

S = SagaState
Handler = Callable[[Turn], None]


# --------------------------------------------------------------------------- before the shutdown
def before_shutdown(t: Turn) -> bool:
    """What every state before the shutdown checks first; True when it decided this turn
    (power came back, or jobs that joined are asked for their checkpoint)."""
    rec = t.rec
    if not rec.at_risk:
        back_before_shutdown(t)
        return True
    if rec.back_before_shutdown_at is not None:
        rec.back_before_shutdown_at = None  # power failed again while the saga waited to hear its jobs
    return False


def detected(t: Turn) -> None:
    rounds.request_power(t)
    t.set(S.CHECKPOINTING, f"{len(t.rec.jobs)} job(s) on {len(t.rec.at_risk)} node(s) at risk")


def checkpointing(t: Turn) -> None:
    rec = t.rec
    if not rounds.settle(t):
        return
    if retried := rounds.retry(t):
        t.set(S.CHECKPOINTING, retried)
        return
    missing = {j: p.missing for j, p in rec.jobs.items() if p.missing}
    if missing:
        t.set(
            S.PARTIAL,
            "missing acks: " + "; ".join(f"{j} ranks {','.join(map(str, r))}" for j, r in sorted(missing.items())),
        )
    else:
        t.set(S.CHECKPOINTED, "every rank acked" if rec.jobs else "no job on the nodes at risk")


def checkpointed(t: Turn) -> None:
    t.set(S.HOLDING, "holding while power may return")


def holding(t: Turn) -> None:
    reason = shutdown_trigger(t) or rounds.final_trigger(t)
    if reason:
        stop(t, reason)
    else:
        rounds.hold(t)


def final_checkpoint(t: Turn) -> None:
    if rounds.settle(t):
        rounds.note_finals(t.rec)
        shutdown(t, t.rec.stop_reason or "stop")


def shutdown_trigger(t: Turn) -> str | None:
    rec, policy = t.rec, t.policy
    if reason := rules.low_battery(rec.supply, t.topo):
        return reason
    runtime = rules.runtime(rec.supply, t.topo)
    if runtime is not None and runtime < policy.shutdown_reserve_s:
        return f"runtime {runtime:.0f}s below the {policy.shutdown_reserve_s:.0f}s shutdown reserve"
    if t.now - rec.created_at >= policy.max_on_battery_s:
        return f"on battery for {policy.max_on_battery_s:.0f}s (max_on_battery_s)"
    return None


def back_before_shutdown(t: Turn) -> None:
    """Power returned before any shutdown. Paused ranks are released at once. The saga ends
    ``cancelled`` once every job it protects has been heard from (a heartbeat) since; a job not
    heard for ``job_silence_s`` died with the power (the site lost power before its shutdown: a
    blackout, a runtime estimate that was wrong) and is restarted from its newest durable
    checkpoint (``restoring``). A job whose ranks deregistered (it ended) is not waited for; one
    merely absent from the registry is silent (the registry lives in the servers' memory: a
    whole-site power cut empties it, and the job's ranks died with the power)."""
    rec, now, policy = t.rec, t.now, t.policy
    if rec.back_before_shutdown_at is None:
        rec.back_before_shutdown_at = now
        for name, plan in sorted(rec.jobs.items()):
            if plan.paused:
                t.emit(simple(rec, "release", name, "release"))
    since = rec.back_before_shutdown_at
    live = jobs_now(t.jobs) if rec.jobs else {}
    ended = t.ended() if callable(t.ended) else t.ended

    def unheard(name: str) -> bool:
        info = live.get(name)
        if info is None:  # absent: ended only if its ranks deregistered (unknown: taken as ended)
            return ended is not None and name not in ended
        return info.heard_at is not None and info.heard_at < since

    silent = sorted(name for name in rec.jobs if unheard(name))
    if not silent:
        t.set(S.CANCELLED, "power back before shutdown")
        return
    if now - since < policy.job_silence_s:
        return
    for name, plan in rec.jobs.items():
        plan.kept_running = name not in silent
    rec.restore_started_at = now
    t.set(
        S.RESTORING,
        f"power back before shutdown, but job(s) {', '.join(silent)} not heard from in {policy.job_silence_s:.0f}s: "
        "they lost their power; restarting from the newest durable checkpoint",
    )


def stop(t: Turn, reason: str) -> None:
    """The saga decided to shut down: a final checkpoint first where the policy asks for one and
    the battery allows it, else the shutdown at once."""
    rec = t.rec
    rec.stop_reason, rec.stop_decided_at = reason, t.now
    asked, longest, skipped = rounds.request_finals(t, reason)
    if asked:
        rec.deadline = t.now + longest
        t.set(S.FINAL_CHECKPOINT, f"{rec.stop_reason}; final checkpoint of {asked} job(s) within {longest:.1f}s")
    else:
        shutdown(t, reason + (f"; final checkpoint skipped: {', '.join(skipped)}" if skipped else ""))


# --------------------------------------------------------------------------- the shutdown
def record_stop(t: Turn) -> None:
    """Where each job is when it is told to stop: the honest start of the work-lost figures."""
    rec = t.rec
    rec.ups_at_stop = {u: rec.ups[u].model_copy() for u in rec.on_battery}
    info = None
    for name, plan in sorted(rec.jobs.items()):
        plan.stopped_at = t.now
        if plan.final is not None and plan.final.complete:
            plan.stop_step, plan.stop_step_exact = plan.final.step, True  # ranks wait at the final step
        elif plan.hold_policy == "pause" and plan.complete:
            plan.stop_step, plan.stop_step_exact = plan.step, True  # ranks wait at the power checkpoint
        else:
            info = jobs_now(t.jobs) if info is None else info
            seen = [plan.step, plan.final.step if plan.final else None, plan.hold_step, plan.step_at_detection]
            if name in info:
                seen.append(info[name].step)
            known = [x for x in seen if x is not None]
            plan.stop_step, plan.stop_step_exact = (max(known) if known else None), False


def shutdown(t: Turn, reason: str) -> None:
    rec, now = t.rec, t.now
    if rec.stop_decided_at is None:
        rec.stop_reason, rec.stop_decided_at = reason, now
    record_stop(t)
    rec.shutdown_reason, rec.shutdown_started_at = reason, now
    t.set(S.SHUTTING_DOWN, reason)
    targets = set(rec.at_risk)
    for name, plan in sorted(rec.jobs.items()):
        if set(plan.ranks.values()) & targets:
            t.emit(job_command(rec, "job_stop", name))
    by_node = rec.jobs_by_node()
    for node in sorted(targets):
        rec.nodes[node].shutdown_at = now
        t.emit(node_command(rec, "shutdown", node, by_node))
    if not targets:
        t.set(S.DOWN, "no node to shut down")


def shutting_down(t: Turn) -> None:
    rec, policy = t.rec, t.policy
    shut = [rec.nodes[n] for n in rec.nodes if rec.nodes[n].shutdown_at is not None]
    retry_offs(t, shut)
    failed = [p for p in shut if p.off_at is not None and p.error is not None]
    late = [p.node for p in shut if p.off_at is None]
    timed_out = t.now - (rec.shutdown_started_at or t.now) >= policy.shutdown_timeout_s
    if late and not timed_out:
        return
    why = [f"off failed on {p.node} ({p.error}): its power state is unknown" for p in failed]
    if late:
        why.append(f"no off report from {', '.join(late)} within {policy.shutdown_timeout_s:.0f}s")
    if why:
        off = [p.node for p in shut if p.off_at is not None and p.error is None]
        t.set(S.PARTLY_DOWN, "; ".join(why) + f"; off: {', '.join(off) or 'none'}")
    else:
        t.set(S.DOWN, "every node at risk is off")


def retry_offs(t: Turn, shut: list[NodePlan]) -> None:
    """Command a node whose off failed off again (power-control falls back to the outlets on a
    retry) while retries are left and the battery has not run out."""
    rec, topo, policy = t.rec, t.topo, t.policy
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
        t.emit(node_command(rec, "shutdown", p.node, by_node))


# --------------------------------------------------------------------------- down
def partly_down(t: Turn) -> None:
    if all(p.off_at is not None and p.error is None for p in t.rec.nodes.values() if p.shutdown_at is not None):
        t.set(S.DOWN, "every node at risk is off (after a failed off)")
        return
    down(t)


def down(t: Turn) -> None:
    rec, now, policy = t.rec, t.now, t.policy
    ups_off(t)
    feeds = {u for n, p in rec.nodes.items() if p.shutdown_at is not None for u in t.topo.feeds.get(n, ())}
    views = [rec.ups.get(u, UpsView()) for u in feeds]
    if views and all(not v.on_battery for v in views):
        back = max(v.since for v in views)
        rec.power_back_at = back
        charged = all(v.charge_pct is None or v.charge_pct >= policy.min_restart_charge_pct for v in views)
        cycled = all(now >= u.told_at + u.delay_s + policy.ups_off_return_s for u in rec.ups_off.values())
        if now - back >= policy.restore_stable_s and charged and cycled:
            restore(t)


def ups_off(t: Turn) -> None:
    """Tell each UPS that :mod:`.killpower` finds due to cut its output and return."""
    rec = t.rec
    if not t.policy.ups_off:
        return
    decision = killpower.decide(rec, now=t.now, topo=t.topo, policy=t.policy)
    for node in decision.shutdown:  # the last stage: the site's storage, then network, first
        shut_down_load(t, node)
    for due in decision.due:
        rec.ups_off[due.ups] = UpsOffPlan(told_at=t.now, delay_s=due.delay_s, reason=due.reason, nodes=list(due.nodes))
        t.emit(ups_command(rec, due.ups))
        for node in due.management:  # PowerGuard's own hosts last: down within the UPS's delay
            shut_down_load(t, node)


def shut_down_load(t: Turn, node: str) -> None:
    plan = t.rec.nodes.setdefault(node, NodePlan(node=node))
    if plan.shutdown_at is None:
        plan.shutdown_at = t.now
        t.emit(node_command(t.rec, "shutdown", node, {}))


# --------------------------------------------------------------------------- the restore
def restore(t: Turn) -> None:
    rec = t.rec
    rec.restore_started_at = t.now
    t.set(S.RESTORING, "power stable")
    for node, plan in sorted(rec.nodes.items()):
        if plan.shutdown_at is not None:
            plan.power_on_at = t.now
            t.emit(node_command(rec, "power_on", node))


def restoring(t: Turn) -> None:
    rec, now, policy = t.rec, t.now, t.policy
    for name, plan in restartable(rec):
        nodes = set(plan.ranks.values())
        powered = [rec.nodes[n] for n in nodes if n in rec.nodes and rec.nodes[n].power_on_at is not None]
        if all(p.ready_at is not None for p in powered) and plan.restart_at is None:
            plan.restart_at = now
            t.emit(job_command(rec, "job_restart", name))
    nodes_ready = all(p.ready_at is not None for p in rec.nodes.values() if p.power_on_at is not None)
    if nodes_ready and all(p.resumed_at is not None for _, p in restartable(rec)):
        t.set(S.RESUMED, "every job resumed")
    elif now - (rec.restore_started_at or now) >= policy.restore_timeout_s:
        late = [p.node for p in rec.nodes.values() if p.power_on_at is not None and p.ready_at is None]
        stuck = [j for j, p in restartable(rec) if p.resumed_at is None]
        t.set(S.FAILED, f"restore timed out: nodes not ready {late}, jobs not resumed {stuck}")


def resumed(t: Turn) -> None:
    t.set(S.DONE, "outage handled")
    for name, plan in sorted(t.rec.jobs.items()):
        if plan.paused:  # a safety net: nothing of this outage may keep a rank waiting
            t.emit(simple(t.rec, "release", name, "release"))


def _none(t: Turn) -> None:
    """A terminal state: nothing follows."""


HANDLERS: dict[SagaState, Handler] = {
    S.DETECTED: detected,
    S.CHECKPOINTING: checkpointing,
    S.CHECKPOINTED: checkpointed,
    S.PARTIAL: checkpointed,
    S.HOLDING: holding,
    S.FINAL_CHECKPOINT: final_checkpoint,
    S.SHUTTING_DOWN: shutting_down,
    S.DOWN: down,
    S.PARTLY_DOWN: partly_down,
    S.RESTORING: restoring,
    S.RESUMED: resumed,
    S.DONE: _none,
    S.CANCELLED: _none,
    S.FAILED: _none,
}


def step(t: Turn) -> None:
    """One step of the machine: the checks every state before the shutdown makes, then the
    state's own handler."""
    rec = t.rec
    if rec.state.before_shutdown and before_shutdown(t):
        return
    if rec.state != S.DETECTED and any(j.requested_at is None for j in rec.jobs.values()):
        rounds.request_power(t)  # jobs that joined mid-saga: asked at once
        if not rec.state.checkpoint_deadline:
            t.set(S.CHECKPOINTING, f"{len(rec.jobs)} job(s) on {len(rec.at_risk)} node(s) at risk")
            return
    HANDLERS[rec.state](t)


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
    set_state(
        old,
        S.FAILED,
        now,
        f"superseded by {new.saga_id}: power failed again during the restore"
        + (f"; it restores {', '.join(carried)}" if carried else ""),
    )
    old.updated_at = now
