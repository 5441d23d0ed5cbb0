"""power-control's Prometheus metrics (alert rules: compose/prometheus/alerts.yml)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

ACTIONS = Counter("powerguard_power_actions_total", "Power and job actions reported", ["action", "outcome"])
REFUSED = Counter(
    "powerguard_power_commands_refused_total",
    "Commands not executed: too old, or of a saga that does not exist",
    ["type"],
)
DEVICE_OK = Gauge(
    "powerguard_power_device_ok",
    "1 while power-control can act on the node (BMC secrets read, BMC and PDU outlets answer), 0 when not",
    ["site", "node"],
)
NODE_READY = Gauge("powerguard_node_ready", "1 once a restored node is ready, 0 while it is off or failed", ["node"])
RESTORE_FAILED = Counter(
    "powerguard_node_restore_failed_total", "Nodes that did not come back after a restore", ["node"]
)
RAMP_QUEUED = Gauge("powerguard_power_ramp_queued", "Nodes waiting for their slot in the power-on ramp")
