"""ups-monitor is ready only when the server stores what it publishes: started with a credential
that may not publish power events (the observer's), it reads its UPS (a real NUT upsd) and says
"not ready" with the cause, and its publish gauge is 0; with its own credential it is ready."""

from __future__ import annotations

import asyncio

from prometheus_client import REGISTRY

from powerguard.schemas import SiteConfig
from powerguard.ups_monitor.config import MonitorSettings
from powerguard.ups_monitor.service import Monitor
from tests.integration.ups.nut_peer import NutServer

from .conftest import SITE

SETTINGS = MonitorSettings(poll_interval_s=0.1, comm_timeout_s=2.0, status_every_s=60, timeout_s=1.0)


async def verdict_after_polls(bus, port: int) -> tuple[bool, str]:
    site = SiteConfig(site=SITE, ups=[{"name": "ups1", "driver": "nut", "port": port}], nodes=[])
    monitor = Monitor(bus, site, settings=SETTINGS, instance="m1")
    seen: list[tuple[bool, str]] = []
    polled = asyncio.Event()
    stop = asyncio.Event()

    def after(readiness) -> None:
        seen.append(readiness.verdict())
        if len(seen) >= 2:  # the first round read the UPS and published (or was refused)
            polled.set()

    task = asyncio.create_task(monitor.run(stop, after))
    try:
        await asyncio.wait_for(polled.wait(), 30)
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
    return seen[-1]


async def test_ups_monitor_with_a_credential_that_cannot_publish_is_not_ready(deployment, tmp_path):
    nut = NutServer(tmp_path).start()
    try:
        wrong = await deployment.connect("observer", service="ups-monitor")
        ready, reason = await verdict_after_polls(wrong, nut.port)
        assert not ready
        assert reason.startswith("cannot publish power events with its credential: "), reason
        assert REGISTRY.get_sample_value("powerguard_ups_monitor_publish_ok", {"site": SITE}) == 0

        right = await deployment.connect("ups-monitor")
        assert await verdict_after_polls(right, nut.port) == (True, "ok")
        assert REGISTRY.get_sample_value("powerguard_ups_monitor_publish_ok", {"site": SITE}) == 1
    finally:
        nut.stop()
