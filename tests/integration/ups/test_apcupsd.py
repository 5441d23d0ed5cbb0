"""ups-monitor with apcupsd as the source (apcupsd polls the UPS over SNMP; we read its NIS)."""

from __future__ import annotations

import asyncio

import pytest

from powerguard.schemas import POWER_EVENTS, SiteConfig
from powerguard.ups_monitor.apcupsd import ApcupsdDriver
from powerguard.ups_monitor.nut import UpsUnreachable

from .apcupsd_peer import Apcupsd
from .nut_peer import free_port
from .snmp_peer import SnmpUps
from .test_nut import monitoring, next_power_event

pytestmark = pytest.mark.integration


@pytest.fixture
def apc(tmp_path):
    (tmp_path / "snmp").mkdir()
    (tmp_path / "apc").mkdir()
    snmp = SnmpUps(tmp_path / "snmp").start()
    try:  # snmpd is stopped even when apcupsd does not start (it was left running)
        daemon = Apcupsd(tmp_path / "apc", snmp).start()
        try:
            yield snmp, daemon
        finally:
            daemon.stop()
    finally:
        snmp.stop()


async def test_outage_sequence_through_apcupsd(bus, apc):
    snmp, daemon = apc
    cfg = SiteConfig(
        site="dc1",
        ups=[{"name": "ups1", "driver": "apcupsd", "port": daemon.port}],
        nodes=[{"name": "n1", "feeds": ["ups1"]}],
    )
    async with bus.subscribe(*POWER_EVENTS, deliver="all") as sub:
        await sub.start()
        async with monitoring(bus, cfg):
            first = await asyncio.wait_for(sub.__anext__(), 20)
            assert not first.data.on_battery and first.data.charge_pct == 100 and first.data.runtime_s == 1800
            snmp.set(on_battery=True, runtime_s=600, charge=80)
            ev = await next_power_event(sub, timeout=20)
            assert ev.short_type == "power.v1.on_battery" and ev.data.runtime_s == 600 and ev.data.charge_pct == 80
            snmp.set(on_battery=True, low_battery=True, runtime_s=120, charge=20)
            ev = await next_power_event(sub, timeout=20)
            assert ev.short_type == "power.v1.low_battery"
            snmp.set(on_battery=False)
            ev = await next_power_event(sub, timeout=20)
            assert ev.short_type == "power.v1.on_line" and ev.data.driver == "apcupsd"


async def test_apcupsd_not_running_is_unreachable():
    with pytest.raises(UpsUnreachable, match=r"apcupsd NIS at 127\.0\.0\.1"):
        await ApcupsdDriver(name="ups1", host="127.0.0.1", port=free_port(), timeout=0.5).poll()
