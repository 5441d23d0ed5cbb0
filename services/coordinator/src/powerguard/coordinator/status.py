"""What ``powerguard status`` shows: the sagas in KV, their state, acks and time budget."""

from __future__ import annotations

import time

from powerguard.bus import Bus

from .figures import saga_figures
from .saga import SagaRecord
from .store import SagaStore


def _restore(rec: SagaRecord) -> dict | None:
    """Nodes asked to power on, ready, and held back by the power-on ramp (None before the restore)."""
    asked = [p for p in rec.nodes.values() if p.power_on_at is not None]
    if not asked:
        return None
    waiting = [p for p in asked if p.ready_at is None and p.waiting]
    return {
        "asked": len(asked),
        "ready": sum(p.ready_at is not None for p in asked),
        "in_ramp": len(waiting),
        "ramp": waiting[-1].waiting if waiting else None,
    }


def _ups_off(rec: SagaRecord) -> dict[str, str]:
    """The last step, per UPS told to cut its output and return: what it said."""
    out = {}
    for ups, t in sorted(rec.ups_off.items()):
        if t.error is not None:
            out[ups] = f"told to cut its output and return: FAILED ({t.error})"
        elif t.done_at is not None:
            at = t.told_at - rec.created_at
            out[ups] = (
                f"told at +{at:.0f}s (the UPS confirmed): output off {t.delay_s:.0f}s later, "
                f"on again with mains ({t.reason})"
            )
        else:
            out[ups] = f"told to cut its output and return, no answer yet ({t.reason})"
    return out


def summarize(rec: SagaRecord, now: float | None = None) -> dict:
    now = time.time() if now is None else now
    acked, expected = rec.acks()
    budget = None
    if rec.state.checkpoint_deadline and rec.deadline is not None:
        budget = max(0.0, rec.deadline - now)
    return {
        "saga": rec.saga_id,
        "site": rec.site,
        "state": rec.state.value,
        "drill": rec.drill,
        "reason": rec.reason,
        "acks": f"{acked}/{expected}",
        "budget_left_s": None if budget is None else round(budget, 1),
        "ups_on_battery": rec.on_battery,
        "nodes_at_risk": rec.at_risk,
        "missing": {j: p.missing for j, p in rec.jobs.items() if p.missing and p.settled_at is not None},
        "restore": _restore(rec),
        "ups_off": _ups_off(rec),
        "started": rec.created_at,
        "age_s": round(now - rec.created_at, 1),
        "trace_id": rec.trace_id,
        **saga_figures(rec),
    }


async def sagas(bus: Bus, *, include_closed: bool = False) -> list[dict]:
    store = SagaStore(await bus.sagas())
    return [summarize(rec) for rec, _ in await store.load(open_only=not include_closed)]
