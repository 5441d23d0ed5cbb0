"""OpenTelemetry: W3C trace context in NATS headers, messaging span attributes, SDK setup
from the standard ``OTEL_*`` environment variables."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.propagate import extract, inject
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, Tracer, TracerProvider

TRACER_NAME = "powerguard.bus"
log = logging.getLogger(__name__)


_PRESET: ContextVar[tuple[int | None, int | None] | None] = ContextVar("pg_preset_ids", default=None)


class PresetIdGenerator(IdGenerator):
    """Random ids, except inside :func:`preset_ids`: lets a span whose children were created
    earlier (maybe by another process) be exported later under the id they point to."""

    def __init__(self) -> None:
        self._random = RandomIdGenerator()

    def generate_span_id(self) -> int:
        preset = _PRESET.get()
        return preset[1] if preset and preset[1] else self._random.generate_span_id()

    def generate_trace_id(self) -> int:
        preset = _PRESET.get()
        return preset[0] if preset and preset[0] else self._random.generate_trace_id()


@contextmanager
def preset_ids(trace_id: str | None, span_id: str | None) -> Iterator[None]:
    """Create exactly one span inside this block to give it these (hex) ids."""
    token = _PRESET.set((int(trace_id, 16) if trace_id else None, int(span_id, 16) if span_id else None))
    try:
        yield
    finally:
        _PRESET.reset(token)


def remote_context(trace_id: str, span_id: str) -> otel_context.Context:
    """A context whose parent is the span with these (hex) ids, wherever it lives."""
    ctx = SpanContext(int(trace_id, 16), int(span_id, 16), is_remote=True, trace_flags=TraceFlags(1))
    return trace.set_span_in_context(NonRecordingSpan(ctx))


def parse_traceparent(value: str | None) -> tuple[str, str] | None:
    """(trace id, span id) of a W3C traceparent header, or None."""
    parts = (value or "").split("-")
    if len(parts) == 4 and len(parts[1]) == 32 and len(parts[2]) == 16:
        return parts[1], parts[2]
    return None


def tracer(provider: TracerProvider | None = None) -> Tracer:
    return trace.get_tracer(TRACER_NAME, tracer_provider=provider)


def inject_headers(headers: dict[str, str], ctx: otel_context.Context | None = None) -> dict[str, str]:
    """Add ``traceparent`` (and ``tracestate``) for the current span to ``headers``."""
    inject(headers, context=ctx)
    return headers


def extract_context(headers: Mapping[str, str] | None) -> otel_context.Context:
    return extract(dict(headers or {}))


def messaging_attributes(
    *,
    operation: str,
    subject: str,
    template: str,
    message_id: str | None,
    event_type: str | None,
    consumer: str | None = None,
) -> dict[str, str]:
    attrs = {
        "messaging.system": "nats",
        "messaging.operation.name": operation,
        "messaging.operation.type": "send" if operation == "publish" else "process",
        "messaging.destination.name": subject,
        "messaging.destination.template": template,
    }
    if message_id:
        attrs["messaging.message.id"] = message_id
    if event_type:
        attrs["cloudevents.event_type"] = event_type
    if consumer:
        attrs["messaging.consumer.group.name"] = consumer
    return attrs


def configure_tracing(service_name: str) -> TracerProvider:
    """Install an SDK tracer provider unless the process already has one.

    Honours ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_EXPORTER``
    (``otlp``, ``console``, ``none``) and ``OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT``. With no
    endpoint and no exporter named, spans are created (trace ids reach the logs) but not exported.
    """
    current = trace.get_tracer_provider()
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    if isinstance(current, SdkTracerProvider):
        return current
    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", service_name)})
    provider = SdkTracerProvider(resource=resource, id_generator=PresetIdGenerator())
    exporter_name = os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    has_endpoint = bool(
        os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )
    if exporter_name == "console":
        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    elif exporter_name != "none" and (exporter_name == "otlp" or has_endpoint):
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            log.warning("OTLP endpoint set but opentelemetry-exporter-otlp-proto-http is not installed")
        else:
            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    return provider
