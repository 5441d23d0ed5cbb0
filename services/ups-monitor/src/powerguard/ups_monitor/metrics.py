"""ups-monitor's Prometheus metrics: the state of every UPS as last read (for dashboards and the
alert rules in compose/prometheus/alerts.yml)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

LABELS = ["site", "ups"]
ON_BATTERY = Gauge("powerguard_ups_on_battery", "1 while the UPS runs from its battery", LABELS)
LOW_BATTERY = Gauge("powerguard_ups_low_battery", "1 while the UPS reports low battery", LABELS)
REPLACE_BATTERY = Gauge("powerguard_ups_replace_battery", "1 while the UPS asks for a new battery", LABELS)
RUNTIME = Gauge("powerguard_ups_runtime_seconds", "Estimated battery runtime left", LABELS)
CHARGE = Gauge("powerguard_ups_charge_percent", "Battery charge", LABELS)
LOAD = Gauge("powerguard_ups_load_percent", "Output load", LABELS)
COMM_OK = Gauge("powerguard_ups_comm_ok", "1 while the UPS answers its polls", LABELS)
UNWATCHED = Gauge("powerguard_ups_unwatched", "1 when a configured UPS cannot be watched (bad options, secret)", LABELS)
PUBLISH_OK = Gauge(
    "powerguard_ups_monitor_publish_ok",
    "1 while the server stores the power events ups-monitor publishes (0: refused, e.g. a wrong credential)",
    ["site"],
)
POLL_ERRORS = Counter(
    "powerguard_ups_poll_errors_total", "Polls that failed outside the driver's own error handling (a bug)", LABELS
)
TRAPS_DROPPED = Counter(
    "powerguard_ups_traps_dropped_total", "Traps not acted on (unknown sender, over the rate limit)", ["reason"]
)
CLOCK_OFFSET = Gauge(
    "powerguard_ups_monitor_clock_offset_seconds",
    "The NATS server's clock minus this host's, measured from a write's stored time (clock.py)",
    ["site"],
)
CLOCK_OFFSET_ERROR = Gauge(
    "powerguard_ups_monitor_clock_offset_error_seconds", "Half the round trip of the last clock probe", ["site"]
)
TRANSITIONS = Counter("powerguard_ups_transitions_total", "Power events published", [*LABELS, "kind"])


def observe(site: str, ups: str, reading) -> None:
    """Record a good reading (a ``Reading``)."""
    labels = (site, ups)
    ON_BATTERY.labels(*labels).set(1 if reading.on_battery else 0)
    LOW_BATTERY.labels(*labels).set(1 if reading.low_battery else 0)
    REPLACE_BATTERY.labels(*labels).set(1 if getattr(reading, "replace_battery", False) else 0)
    COMM_OK.labels(*labels).set(1)
    for gauge, value in ((RUNTIME, reading.runtime_s), (CHARGE, reading.charge_pct), (LOAD, reading.load_pct)):
        if value is not None:
            gauge.labels(*labels).set(value)


def comm_lost(site: str, ups: str) -> None:
    COMM_OK.labels(site, ups).set(0)
