"""Threat 7: SNMP traps are claims, not facts. A spoofed low-battery trap "from" a UPS whose
polls fail must not become a power event (it used to: the site shut down within a second);
a trap flood is rate-limited; a trap from an answering UPS still gives its event at once."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess

import pytest

from powerguard.schemas import POWER_EVENTS, SiteConfig
from powerguard.ups_monitor import metrics
from powerguard.ups_monitor.config import MonitorSettings
from powerguard.ups_monitor.service import Monitor
from tests.conftest import require_binary
from tests.integration.ups.nut_peer import free_port
from tests.integration.ups.snmp_peer import SnmpUps

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
LOW_BATTERY_TRAP = ("1.3.6.1.2.1.33.2.3", "1.3.6.1.2.1.33.1.6.2.1.2.1", "o", "1.3.6.1.2.1.33.1.6.3.3")


def trap(port: int, *oids: str) -> None:
    subprocess.run(["snmptrap", "-v2c", "-c", "public", f"127.0.0.1:{port}", "", *oids], check=True, timeout=10)


def cfg(port: int) -> SiteConfig:
    return SiteConfig(
        site="dc1",
        ups=[{"name": "ups1", "driver": "snmp", "port": port, "options": {"profile": "ups-mib"}}],
        nodes=[{"name": "n1", "feeds": ["ups1"]}],
    )


@contextlib.asynccontextmanager
async def monitor(bus, site: SiteConfig, trap_port: int):
    settings = MonitorSettings(
        poll_interval_s=60,
        comm_timeout_s=120,
        status_every_s=600,
        timeout_s=0.5,
        trap_host="127.0.0.1",
        trap_port=trap_port,
        trap_community={"env": "PG_T_TRAP_COMMUNITY"},
        trap_rate_per_s=1.0,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(Monitor(bus, site, settings=settings, instance="m1").run(stop))
    try:
        await asyncio.sleep(0.5)
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


async def events(sub, seconds: float) -> list:
    out = []
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            async for ev in sub:
                out.append(ev.short_type)
    return out


async def test_7_a_trap_alone_never_makes_a_power_event_and_a_flood_is_rate_limited(bus, tmp_path, monkeypatch):
    require_binary("snmptrap", "snmp")
    monkeypatch.setenv("PG_T_TRAP_COMMUNITY", "public")
    port, silent = free_port(), free_port()  # no SNMP agent answers on `silent`: every poll fails
    async with bus.subscribe(*POWER_EVENTS, deliver="new") as sub:
        await sub.start()
        async with monitor(bus, cfg(silent), port):
            before = metrics.TRAPS_DROPPED.labels("rate")._value.get()
            for _ in range(20):  # a spoofed low-battery trap, from the UPS's own address, twenty times
                trap(port, *LOW_BATTERY_TRAP)
            seen = await events(sub, 3.0)
    assert "power.v1.low_battery" not in seen and "power.v1.on_battery" not in seen
    assert metrics.TRAPS_DROPPED.labels("rate")._value.get() >= before + 10  # 1/s, burst 2


async def test_7_a_trap_from_an_answering_ups_still_gives_its_event_at_once(bus, tmp_path, monkeypatch):
    require_binary("snmptrap", "snmp")
    monkeypatch.setenv("PG_T_TRAP_COMMUNITY", "public")
    ups = SnmpUps(tmp_path).start()
    try:
        port = free_port()
        async with bus.subscribe(*POWER_EVENTS, deliver="new") as sub:
            await sub.start()
            async with monitor(bus, cfg(ups.port), port):
                ups.set(on_battery=True, low_battery=True, runtime_s=100)
                trap(port, *LOW_BATTERY_TRAP)
                seen = await events(sub, 3.0)
    finally:
        ups.stop()
    assert "power.v1.low_battery" in seen
