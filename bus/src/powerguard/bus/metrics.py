"""Prometheus metrics of the bus (process-wide registry)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

PUBLISHED = Counter("powerguard_bus_published_total", "Events stored by JetStream", ["type"])
PUBLISH_ERRORS = Counter("powerguard_bus_publish_errors_total", "Publishes that failed", ["type"])
CONSUMED = Counter("powerguard_bus_consumed_total", "Messages processed by handlers", ["consumer", "outcome"])
DEAD_LETTERS = Counter("powerguard_bus_dead_letters_total", "Messages sent to the DLQ", ["reason"])
DEAD_LETTERS_SUPPRESSED = Counter(
    "powerguard_bus_dead_letters_suppressed_total",
    "Rejected messages refused without a DLQ copy (over the consumer's dead-letter rate)",
    ["consumer", "reason"],
)
HANDLER_SECONDS = Histogram(
    "powerguard_bus_handler_seconds",
    "Handler duration",
    ["consumer"],
    buckets=(0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5),
)
CREDENTIAL_EXPIRY = Gauge(
    "powerguard_credential_expiry_timestamp_seconds",
    "When this service's NATS credential expires (Unix time; absent: it does not)",
    ["service"],
)
