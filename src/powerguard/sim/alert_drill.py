"""An outage drill of the simulated site with real alerting around it (``powerguard.sim.alerts``):
the on-battery page and its resolution, then a dead-lettered message and a killed service, each
as the pager receives it. Returns what was paged and when (the end-to-end test asserts on it;
``bench/alerting.py`` reports the latencies)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from powerguard.bus import Bus, BusNames
from powerguard.bus.roles import SERVICES
from powerguard.schemas import OnBattery

from .alerts import FOR_S, Alerting, Pager, dump, service_port, start_exporter
from .drill import run_drill
from .site import SimSite, SiteOptions


async def alert_drill(workdir: Path, *, steps: int = 200) -> dict[str, Any]:
    site = SimSite(workdir / "site", SiteOptions(steps=steps))
    pager = Pager()
    alerting: Alerting | None = None
    exporter = None
    bus: Bus | None = None
    try:
        await site.start()
        assert site.nats is not None
        targets = {
            f"powerguard-{svc}": await asyncio.to_thread(service_port, site.workdir / f"{svc}.log") for svc in SERVICES
        }
        exporter, targets["powerguard-jetstream"] = start_exporter(
            site.site_file, site.nats_url, site.workdir / "jetstream-exporter.log"
        )
        alerting = Alerting(workdir / "alerting", targets, await pager.start())
        alerting.start()
        bus = await Bus.connect(site.nats.url, service="alert-drill", names=BusNames())
        on_battery_at: list[float] = []

        async def watch() -> None:
            async for e in bus.subscribe(OnBattery):
                on_battery_at.append(e.data.observed_at.timestamp())

        watcher = asyncio.create_task(watch())
        await asyncio.sleep(5)  # Prometheus has scraped every target a few times
        report = await run_drill(site, "outage", notify=lambda *_: None, bus=bus)
        fired = await pager.wait("UpsOnBattery", timeout_s=10)  # paged during the outage already
        resolved = await pager.wait("UpsOnBattery", "resolved", timeout_s=120)

        # a message the coordinator must reject: malformed bytes on a subject it consumes
        t_bad = time.time()
        await bus.js.publish(bus.subjects.power("demo", "ups-a"), b"{not an event")
        dead = await pager.wait("DeadLettersAppearing", timeout_s=60, service="coordinator")

        t_kill = time.time()
        site.kill("power-control")
        down = await pager.wait("PowerGuardServiceDown", timeout_s=60, job="powerguard-power-control")
        watcher.cancel()
        outage_at = on_battery_at[0] if on_battery_at else None
        result = {
            "report": report,
            "pages": [{"at": p.at, "status": p.status, "alert": p.name, "labels": p.labels} for p in pager.pages],
            "on_battery_event_at": outage_at,
            "on_battery_paged_at": fired.at,
            "on_battery_resolved_at": resolved.at,
            "on_battery_labels": fired.labels,
            # utility failure -> page: the drill's detection time plus on_battery event -> webhook
            "utility_failure_to_page_s": None
            if outage_at is None
            else round(fired.at - outage_at + (report.get("detected_s") or 0.0), 3),
            "dead_letter_to_page_s": round(dead.at - t_bad, 3),
            "service_killed_to_page_s": round(down.at - t_kill, 3),
            "for_s": FOR_S,
        }
        dump(pager.pages, workdir / "pages.json")
        return result
    finally:
        if bus is not None:
            await bus.close()
        if alerting is not None:
            alerting.stop()
        if exporter is not None:
            exporter.terminate()
            exporter.wait(10)
        await pager.stop()
        await site.stop()
