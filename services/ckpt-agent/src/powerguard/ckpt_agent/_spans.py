"""Where the ckpt-agent's spans join the outage trace: a checkpoint span under the request's
``traceparent`` (the acks are published inside it), and restore/resume spans under the
``TRACEPARENT`` environment variable a scheduler adapter sets when it restarts the job."""

from __future__ import annotations

import os
from collections.abc import Iterable

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode

from powerguard.bus.tracing import parse_traceparent, remote_context

_TRACER = "powerguard.ckpt_agent"


def tracer() -> trace.Tracer:
    return trace.get_tracer(_TRACER)


def parent(traceparents: Iterable[str | None]) -> otel_context.Context | None:
    """The first valid W3C traceparent as a parent context (None: a new trace)."""
    for value in traceparents:
        ids = parse_traceparent(value)
        if ids:
            return remote_context(*ids)
    return None


def job_parent() -> otel_context.Context | None:
    return parent([os.environ.get("TRACEPARENT")])


def start(name: str, ctx: otel_context.Context | None, start_s: float | None = None, **attrs: object) -> Span:
    return tracer().start_span(
        name,
        context=ctx,
        start_time=int(start_s * 1e9) if start_s is not None else None,
        attributes={k: v for k, v in attrs.items() if v is not None},
    )


def failed(span: Span, exc: BaseException) -> None:
    span.record_exception(exc)
    span.set_status(Status(StatusCode.ERROR, str(exc)))


def inside(span: Span) -> otel_context.Context:
    return trace.set_span_in_context(span)
