"""The honest figures of an outage, read off a saga record (pure).

"Work lost" is measured at the stop: the steps a job had trained when it was told to stop,
minus the step it restarted from (or, before a restart, the newest step every rank made
durable). Steps since detection are reported next to it, never instead of it: a checkpoint
taken at detection followed by a hold of training that is thrown away is a loss, not RPO 0.
"""

from __future__ import annotations

from typing import Any

from powerguard.schemas import SagaState

from .record import JobPlan, SagaRecord

S = SagaState


def lost_steps(plan: JobPlan, rec: SagaRecord) -> int | None:
    """Steps this job trained that it will train again (None: not known yet)."""
    if rec.state == S.CANCELLED or (plan.stopped_at is None and rec.state in (S.DONE, S.RESUMED)):
        return 0  # never stopped: nothing thrown away
    if plan.stop_step is None:
        return None
    restart = plan.resumed_step if plan.resumed_step is not None else plan.durable_step
    if restart is None:
        return None
    return max(0, plan.stop_step - restart)


def job_figures(plan: JobPlan, rec: SagaRecord) -> dict[str, Any]:
    lost = lost_steps(plan, rec)
    # the hold's training: from the power checkpoint (taken at the first step boundary after the
    # request; the step at detection comes from heartbeats and may be seconds old) to the stop
    base = plan.step if plan.complete else plan.step_at_detection
    trained = None
    if plan.stop_step is not None and base is not None:
        trained = max(0, plan.stop_step - base)
    lost_s = None
    if lost is not None and trained and plan.stopped_at is not None and plan.requested_at is not None:
        lost_s = round(lost * (plan.stopped_at - plan.requested_at) / trained, 3)  # seconds per step in the hold
    elif lost == 0:
        lost_s = 0.0
    return {
        "hold_policy": plan.hold_policy,
        "step_at_detection": plan.step_at_detection,
        "checkpoint_step": plan.step if plan.complete else None,
        "final_checkpoint_step": plan.final.step if plan.final is not None and plan.final.complete else None,
        "final_checkpoint": plan.final_note,
        "stop_step": plan.stop_step,
        "stop_step_exact": plan.stop_step_exact,
        "steps_since_checkpoint": trained,
        "durable_step": plan.durable_step,
        "resumed_step": plan.resumed_step,
        "lost_steps": lost,
        "lost_steps_at_least": lost is not None and not plan.stop_step_exact,  # stop step from heartbeats
        "lost_s": lost_s,
        "kept_steps": None if trained is None or lost is None else max(0, trained - lost),
    }


def hold_s(rec: SagaRecord) -> float | None:
    """From the first hold to the stop decision (or the end of the saga, or now when open)."""
    start = next((t.at for t in rec.history if t.state == S.HOLDING), None)
    if start is None:
        return None
    end = rec.stop_decided_at
    if end is None:
        end = next((t.at for t in rec.history if t.at >= start and t.state.terminal), rec.updated_at)
    return round(end - start, 3)


def rpo_steps(rec: SagaRecord) -> int | None:
    """Work lost at the stop, worst job (0 when no job lost anything; None when not known)."""
    lost = [lost_steps(p, rec) for p in rec.jobs.values()]
    if not lost:
        return 0 if rec.terminal else None
    return None if any(x is None for x in lost) else max(lost)  # type: ignore[type-var]


def rto_s(rec: SagaRecord) -> float | None:
    """Power back to every job resumed."""
    if rec.power_back_at is None:
        return None
    resumed = [p.resumed_at for p in rec.jobs.values() if p.resumed_at is not None]
    if not resumed or len(resumed) != len(rec.jobs):
        return None
    return max(resumed) - rec.power_back_at


def saga_figures(rec: SagaRecord) -> dict[str, Any]:
    """Everything `powerguard status`, the trace and the drill report say about what was lost."""
    ups = rec.ups_at_stop
    runtimes = [v.runtime_s for v in ups.values() if v.runtime_s is not None]
    charges = [v.charge_pct for v in ups.values() if v.charge_pct is not None]
    return {
        "lost_steps": rpo_steps(rec),
        "hold_s": hold_s(rec),
        "stop_reason": rec.stop_reason,
        "runtime_at_stop_s": min(runtimes) if runtimes else None,
        "charge_at_stop_pct": min(charges) if charges else None,
        "rto_s": None if (r := rto_s(rec)) is None else round(r, 3),
        "jobs": {name: job_figures(p, rec) for name, p in sorted(rec.jobs.items())},
        "battery": battery_figures(rec),
        "nodes_not_off": {
            n: p.error for n, p in sorted(rec.nodes.items()) if p.shutdown_at and not p.off_at and p.error
        },
    }


def battery_figures(rec: SagaRecord) -> dict[str, dict[str, Any]]:
    """Per UPS of the outage: its first runtime estimate against what its observed discharge
    gave, at the load observed (a ratio below 1: the estimate was optimistic, an aged battery)."""
    out = {}
    for ups, b in sorted(rec.battery.items()):
        ratio = b.ratio
        out[ups] = {
            "predicted_s": None if b.predicted_s is None else round(b.predicted_s, 1),
            "observed_s": None if b.observed_s is None else round(b.observed_s, 1),
            "ratio": None if ratio is None else round(ratio, 3),
            "load_pct": b.load_pct,
        }
    return out
