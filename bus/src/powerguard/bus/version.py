"""Which release is running: one version for every PowerGuard package (``VERSION`` at the
repository's root, read by each package's build), as each process reports it (``--version``,
its start line, the ``powerguard_build_info`` metric), so an upgrade is seen to have happened."""

from __future__ import annotations

from importlib import metadata

from prometheus_client import Gauge

BUILD_INFO = Gauge("powerguard_build_info", "The release a PowerGuard process runs (always 1)", ["service", "version"])

# the distribution each process runs from
DISTRIBUTIONS = {
    "coordinator": "powerguard-coordinator",
    "power-control": "powerguard-power-control",
    "ups-monitor": "powerguard-ups-monitor",
    "exporter": "powerguard-bus",
    "console": "powerguard",
    "powerguard": "powerguard",
    "ckpt-agent": "powerguard-ckpt-agent",
}


def version(service: str = "powerguard") -> str:
    """The installed version of ``service``'s distribution ("unknown" when not installed)."""
    try:
        return metadata.version(DISTRIBUTIONS.get(service, service))
    except metadata.PackageNotFoundError:
        return "unknown"


def announce(service: str) -> str:
    """Set ``powerguard_build_info{service, version}`` to 1; return the version."""
    v = version(service)
    BUILD_INFO.labels(service, v).set(1)
    return v
