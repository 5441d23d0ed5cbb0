"""The outage trace: one trace per saga, built from the saga record.

Phase spans are exported when a phase ends, with the start and end times the record holds,
as children of the root span ``outage <site>``. The root span is exported last, when the saga
is terminal, under the span id every child already points to (stored in the record), so a
coordinator restarted mid-saga continues the same trace."""

from __future__ import annotations

import functools

from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

from powerguard.bus.tracing import preset_ids, remote_context
from powerguard.schemas import SagaState

from .figures import job_figures, saga_figures
from .record import SagaRecord

S = SagaState


def _ns(t: float) -> int:
    return int(t * 1e9)


def root_context(rec: SagaRecord):
    return remote_context(rec.trace_id, rec.root_span_id)


def _emit(
    tracer: Tracer,
    rec: SagaRecord,
    key: str,
    name: str,
    start: float,
    end: float,
    attrs: dict,
    error: str | None = None,
    *,
    done: set[str],
) -> None:
    if key in rec.spans_done or key in done:
        return
    span: Span = tracer.start_span(
        name, context=root_context(rec), start_time=_ns(start), attributes={"powerguard.saga_id": rec.saga_id, **attrs}
    )
    if error:
        span.set_status(Status(StatusCode.ERROR, error))
    span.end(end_time=_ns(max(start, end)))
    done.add(key)


def emit_finished(tracer: Tracer, rec: SagaRecord, now: float) -> set[str]:
    """Export every phase span that has ended and was not exported yet (``rec.spans_done``);
    the keys of those exported now. The record is not changed: the caller stores the keys
    with it, so a restarted coordinator does not export them again."""
    done: set[str] = set()
    emit = functools.partial(_emit, done=done)
    for name, p in sorted(rec.jobs.items()):
        for key, label, rnd in ((f"ckpt/{name}", "checkpoint", p), (f"final/{name}", "final checkpoint", p.final)):
            if rnd is None or rnd.requested_at is None or rnd.settled_at is None:
                continue
            emit(
                tracer,
                rec,
                key,
                f"{label} {name}",
                rnd.requested_at,
                rnd.settled_at,
                {
                    "powerguard.job": name,
                    "powerguard.hold_policy": p.hold_policy,
                    "powerguard.ranks_expected": rnd.world_size,
                    "powerguard.ranks_acked": len(rnd.acked),
                    "powerguard.step": rnd.step if rnd.step is not None else -1,
                    "powerguard.missing_ranks": ",".join(map(str, rnd.missing)),
                },
                error=f"ranks {rnd.missing} did not ack" if rnd.missing else None,
            )
        if p.restart_at is not None and p.resumed_at is not None:
            emit(
                tracer,
                rec,
                f"restart/{name}",
                f"restart {name}",
                p.restart_at,
                p.resumed_at,
                {
                    "powerguard.job": name,
                    "powerguard.resumed_step": p.resumed_step if p.resumed_step is not None else -1,
                },
            )
    for node, n in sorted(rec.nodes.items()):
        if n.shutdown_at is not None and n.off_at is not None:
            emit(
                tracer,
                rec,
                f"off/{node}",
                f"shutdown {node}",
                n.shutdown_at,
                n.off_at,
                {"powerguard.node": node},
                error=n.error,
            )
        if n.power_on_at is not None and n.ready_at is not None:
            emit(tracer, rec, f"on/{node}", f"power_on {node}", n.power_on_at, n.ready_at, {"powerguard.node": node})
    for i, t in enumerate(rec.history[:-1]):
        if t.state == S.HOLDING:
            emit(
                tracer,
                rec,
                f"hold/{i}",
                "hold",
                t.at,
                rec.history[i + 1].at,
                {"powerguard.next_state": rec.history[i + 1].state.value},
            )
    if rec.terminal and "root" not in rec.spans_done:
        _emit_root(tracer, rec, now)
        done.add("root")
    return done


def _emit_root(tracer: Tracer, rec: SagaRecord, now: float) -> None:
    parent = remote_context(rec.trace_id, rec.parent_span_id) if rec.parent_span_id else None
    attrs = {
        "powerguard.saga_id": rec.saga_id,
        "powerguard.site": rec.site,
        "powerguard.state": rec.state.value,
        "powerguard.jobs": len(rec.jobs),
        "powerguard.nodes": len(rec.nodes),
    }
    figures = saga_figures(rec)
    for key in ("lost_steps", "hold_s", "runtime_at_stop_s", "charge_at_stop_pct", "rto_s", "stop_reason"):
        if figures[key] is not None:
            attrs[f"powerguard.{key}"] = figures[key]
    if figures["lost_steps"] is not None:
        attrs["powerguard.rpo_steps"] = figures["lost_steps"]  # work lost at the stop, worst job
    if figures["nodes_not_off"]:  # an off that failed and never succeeded: never hidden as "down"
        attrs["powerguard.nodes_not_off"] = ", ".join(figures["nodes_not_off"])
    if S.PARTLY_DOWN in {t.state for t in rec.history}:
        attrs["powerguard.partly_down"] = True
    for ups, b in figures["battery"].items():
        for key in ("predicted_s", "observed_s", "ratio"):
            if b[key] is not None:
                attrs[f"powerguard.ups.{ups}.runtime_{key}"] = b[key]
    for name, plan in sorted(rec.jobs.items()):
        for key, value in job_figures(plan, rec).items():
            if value is not None:
                attrs[f"powerguard.job.{name}.{key}"] = value
    with preset_ids(None if parent else rec.trace_id, rec.root_span_id):
        span = tracer.start_span(
            f"outage {rec.site}",
            context=parent,
            kind=SpanKind.INTERNAL,
            start_time=_ns(rec.created_at),
            attributes=attrs,
        )
    if rec.state == S.FAILED:
        span.set_status(Status(StatusCode.ERROR, rec.reason or "failed"))
    span.end(end_time=_ns(now))
