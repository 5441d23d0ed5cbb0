"""The coordinator's gauges, set from what it holds (metrics.py defines them)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping

from . import metrics
from .record import SagaRecord
from .topology import JobHealth


def battery(rec: SagaRecord, shutdown_need: Mapping[str, float], need: Callable[[], float]) -> None:
    """Each UPS's estimate against what happened (real outages), and whether it still covers
    the site's slowest measured checkpoint, its shutdown and the margin (``need()``)."""
    for group, seconds in shutdown_need.items():
        metrics.SHUTDOWN_MEASURED.labels(group).set(seconds)
    if rec.drill:
        return
    for ups, fig in rec.battery.items():
        if fig.predicted_s is not None:
            metrics.UPS_PREDICTED.labels(ups).set(fig.predicted_s)
        if fig.observed_s is not None:
            metrics.UPS_OBSERVED.labels(ups).set(fig.observed_s)
            metrics.UPS_HEADROOM.labels(ups).set(fig.observed_s - need())
        if fig.ratio is not None:
            metrics.UPS_RATIO.labels(ups).set(fig.ratio)


def jobs(health: Mapping[str, JobHealth], gauged: set[str]) -> set[str]:
    """Each registered job's ranks heard, world size, last heard and credential expiry; a job
    that deregistered (in ``gauged``, not in ``health``) leaves the series. Returns the jobs
    gauged now."""
    for job in gauged - set(health):
        for g in (
            metrics.JOB_RANKS_HEARD,
            metrics.JOB_WORLD_SIZE,
            metrics.JOB_LAST_HEARD,
            metrics.JOB_CREDENTIAL_EXPIRY,
        ):
            with contextlib.suppress(KeyError):
                g.remove(job)
    for job, h in health.items():
        metrics.JOB_RANKS_HEARD.labels(job).set(h.heard)
        metrics.JOB_WORLD_SIZE.labels(job).set(h.world_size)
        if h.heard_at is not None and h.heard_at > 0:
            metrics.JOB_LAST_HEARD.labels(job).set(h.heard_at)
        if h.credential_expires is not None:
            metrics.JOB_CREDENTIAL_EXPIRY.labels(job).set(h.credential_expires)
    return set(health)


def sagas(open_sagas: Mapping[str, SagaRecord], site: str) -> None:
    metrics.OPEN_SAGAS.set(len(open_sagas))
    metrics.SHUTTING_DOWN.labels(site).set(sum(r.state.powered_down for r in open_sagas.values()))
