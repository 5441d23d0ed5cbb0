"""The saga's checkpoint rounds: the power checkpoint (and its retries), the hold
checkpoints, the final checkpoint's trigger and outcome, and each job's recorded step.

A round is requested with a deadline the battery budget bounds (:mod:`.budget`), settled once
every rank answered or its deadline passed; a shrinking budget shrinks open deadlines and the
ranks are told again (same request id, the new deadline)."""

from __future__ import annotations

from dataclasses import replace

from powerguard.schemas import command_key

from . import budget as rules
from .commands import ckpt_command, hold_command, round_action, simple
from .record import CkptRound, JobPlan, SagaRecord
from .turn import Turn

DEADLINE_RESEND_S = 2.0  # a deadline shrunk by more than this is sent to the ranks again


def budget_deadline(t: Turn) -> float:
    return t.now + rules.budget_s(t.rec.supply, t.topo, t.policy)


def request_power(t: Turn) -> None:
    """The power checkpoint of every job not yet asked (the saga's first, or a job that joined)."""
    deadline = budget_deadline(t)
    t.rec.deadline = deadline
    for _, plan in sorted(t.rec.jobs.items()):
        if plan.requested_at is None:
            plan.requested_at, plan.deadline, plan.told_deadline = t.now, deadline, deadline
            t.emit(ckpt_command(t.rec, plan, final=False, policy=t.policy))


def requested(rec: SagaRecord) -> list[CkptRound]:
    """Every power and final round of the saga that was requested."""
    out: list[CkptRound] = []
    for _, plan in sorted(rec.jobs.items()):
        out += [r for r in (plan, plan.final) if r is not None and r.requested_at is not None]
    return out


def settle(t: Turn) -> bool:
    """Shrink open deadlines to the battery budget (and tell the ranks), settle rounds that
    are answered or past their deadline; True when every round is settled."""
    rec, now = t.rec, t.now
    budget = budget_deadline(t)  # the battery only ever shrinks a deadline
    open_rounds = [r for r in requested(rec) if r.settled_at is None]
    for plan in rec.jobs.values():
        if plan.settled_at is None and plan.deadline is not None and plan.requested_at is not None:
            plan.deadline = min(plan.deadline, budget)
        f = plan.final
        if f is not None and f.settled_at is None and f.deadline is not None:  # its own window (budget or margin)
            window = rules.final_window(rec.supply, t.topo, t.policy, plan.duration_s)
            f.deadline = min(f.deadline, now + window.seconds)
    for plan in rec.jobs.values():
        for final, r in ((False, plan), (True, plan.final)):
            if r is None or r.settled_at is not None or r.deadline is None or r.told_deadline is None:
                continue
            if r.deadline < r.told_deadline - DEADLINE_RESEND_S and now < r.deadline:
                r.told_deadline = r.deadline
                cmd = ckpt_command(rec, plan, final=final, policy=t.policy)
                t.emit(replace(cmd, key=f"{cmd.key}.deadline-{int(r.deadline * 1000)}"))
    deadlines = [r.deadline for r in open_rounds if r.deadline]
    rec.deadline = max(deadlines) if deadlines else rec.deadline
    for r in open_rounds:
        if r.answered or now >= (r.deadline or now):
            r.settled_at = now
    return all(r.settled_at is not None for r in requested(rec))


def retry(t: Turn) -> str | None:
    """A new round for each job whose power checkpoint failed (a rank reported an error, or
    some rank did not answer in time) while retries and the battery budget are left; returns
    the reason to record, or None when nothing is retried."""
    rec, now, policy = t.rec, t.now, t.policy
    budget = rules.budget_s(rec.supply, t.topo, policy)
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
        plan.request_id = command_key(rec.saga_id, name, round_action(plan.attempt))
        plan.acked, plan.failed, plan.levels, plan.settled_at = {}, {}, {}, None
        plan.requested_at, plan.deadline, plan.told_deadline = now, now + budget, now + budget
        t.emit(ckpt_command(rec, plan, final=False, policy=policy))
        retried.append(f"{name} (attempt {plan.attempt} of {policy.ckpt_retries + 1}: {why})")
    return f"power checkpoint retried: {'; '.join(retried)}" if retried else None


def hold(t: Turn) -> None:
    """While holding, a checkpoint of every ``checkpoint-at-stop`` job at risk every
    ``hold_checkpoint_every_s`` (never more often than its measured power checkpoint allows at
    ``hold_checkpoint_max_share``), one round at a time, each within the battery budget: the
    training at risk at any moment stays bounded even when no final checkpoint can be taken."""
    rec, now, policy = t.rec, t.now, t.policy
    if not policy.hold_checkpoint_every_s:
        return
    budget = rules.budget_s(rec.supply, t.topo, policy)
    for plan in final_candidates(rec):
        h = plan.hold
        if h is not None and h.settled_at is None:
            if now >= (h.deadline or now):
                settle_hold(plan)
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
        t.emit(hold_command(rec, plan))


def settle_hold(plan: JobPlan) -> None:
    """A hold round answered (or out of time): its step counts once every rank made it durable."""
    h = plan.hold
    if h is not None and not h.missing and h.step is not None and h.step >= (plan.hold_step or 0):
        plan.hold_step, plan.hold_commit = h.step, h.commit


def final_candidates(rec: SagaRecord) -> list[JobPlan]:
    """The jobs at risk whose policy asks for a final checkpoint not yet requested."""
    at_risk = set(rec.at_risk)
    return [
        p
        for _, p in sorted(rec.jobs.items())
        if p.hold_policy == "checkpoint-at-stop" and p.final is None and set(p.ranks.values()) & at_risk
    ]


def final_estimate_s(rec: SagaRecord) -> float | None:
    """How long a final checkpoint will take: the slowest job's measured power checkpoint."""
    known = [d for p in final_candidates(rec) if (d := p.duration_s) is not None]
    return max(known) if known else None


def final_trigger(t: Turn) -> str | None:
    """Stop early enough that a final checkpoint fits before the shutdown reserve: when the
    budget left falls to ``final_ckpt_factor`` times the measured checkpoint duration."""
    policy = t.policy
    runtime, estimate = rules.runtime(t.rec.supply, t.topo), final_estimate_s(t.rec)
    if runtime is None or estimate is None:
        return None
    left = runtime - policy.shutdown_reserve_s - policy.margin_s
    if left <= policy.final_ckpt_factor * estimate:
        return (
            f"runtime {runtime:.0f}s: {max(0.0, left):.1f}s left before the {policy.shutdown_reserve_s:.0f}s shutdown "
            f"reserve, time for the final checkpoint (~{estimate:.1f}s)"
        )
    return None


def request_finals(t: Turn, reason: str) -> tuple[int, float, list[str]]:
    """The final checkpoint of each candidate the battery leaves a window for; returns (how
    many were asked, the longest window, the jobs skipped)."""
    rec, now = t.rec, t.now
    asked, skipped, longest = 0, [], 0.0
    for plan in final_candidates(rec):
        window = rules.final_window(rec.supply, t.topo, t.policy, plan.duration_s)
        if window.why_skipped is not None:
            why = window.why_skipped if reason in window.why_skipped else f"{window.why_skipped} ({reason})"
            plan.final_note = f"skipped: {why}; stopped on {newest_checkpoint(plan)}"
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
        t.emit(ckpt_command(rec, plan, final=True, policy=t.policy))
        asked, longest = asked + 1, max(longest, window.seconds)
    return asked, longest, skipped


def newest_checkpoint(plan: JobPlan) -> str:
    """What a job stopped without its final checkpoint restarts from, in words."""
    if plan.hold_step is not None and (plan.step is None or plan.hold_step > plan.step):
        return f"its hold checkpoint of step {plan.hold_step}"
    return "the power checkpoint"


def note_finals(rec: SagaRecord) -> None:
    """How each final checkpoint ended, in words (``final_note``)."""
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
            plan.final_note = f"failed ({why}); stopped on {newest_checkpoint(plan)}"


def record_durable(t: Turn) -> None:
    """Announce each job's newest step every rank made durable, once per step: a restore never
    picks an older one, and takes the copy the acks named."""
    for job, plan in t.rec.jobs.items():
        step = plan.durable_step
        if step is not None and (plan.recorded_step is None or step > plan.recorded_step):
            plan.recorded_step = step
            t.emit(simple(t.rec, "ckpt_recorded", job, f"recorded.{step}", step=step, commit=plan.durable_commit))
