"""OpenTelemetry: W3C trace context in NATS headers, messaging span attributes, SDK setup
from the standard ``OTEL_*`` environment variables."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.propagate import extract, inject
from opentelemetry.trace import Tracer, TracerProvider

TRACER_NAME = "powerguard.bus"
log = logging.getLogger(__name__)


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
    provider = SdkTracerProvider(resource=resource)
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
