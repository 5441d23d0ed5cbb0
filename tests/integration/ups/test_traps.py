"""SNMP traps (sent with net-snmp's snmptrap) make the monitor poll at once."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess

import pytest

from powerguard.schemas import POWER_EVENTS, PowerStatus, SiteConfig
from powerguard.ups_monitor.config import MonitorSettings
from powerguard.ups_monitor.service import Monitor

from .nut_peer import free_port
from .snmp_peer import V3_AUTH, V3_PRIV, V3_USER, SnmpUps
from .test_nut import next_power_event

pytestmark = pytest.mark.integration
ENGINE_ID = "8000000001020304"


@pytest.fixture
def agent(tmp_path):
    ups = SnmpUps(tmp_path).start()
    yield ups
    ups.stop()


@contextlib.asynccontextmanager
async def trap_monitor(bus, cfg: SiteConfig, trap_port: int, **extra):
    # polls are 60 s apart: anything seen sooner came through the trap
    settings = MonitorSettings(
        **extra,
        poll_interval_s=60,
        comm_timeout_s=120,
        status_every_s=600,
        timeout_s=1.0,
        trap_host="127.0.0.1",
        trap_port=trap_port,
    )
    stop = asyncio.Event()
    monitor = Monitor(bus, cfg, settings=settings, instance="m1")
    task = asyncio.create_task(monitor.run(stop))
    try:
        yield monitor
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


def snmptrap(*args: str) -> None:
    subprocess.run(["snmptrap", *args], check=True, capture_output=True, timeout=10)


async def test_v2c_on_battery_trap_is_detected_without_waiting_for_a_poll(bus, agent, monkeypatch):
    monkeypatch.setenv("PG_T_COMMUNITY", "public")
    port = free_port()
    cfg = SiteConfig(
        site="dc1",
        ups=[{"name": "ups1", "driver": "snmp", "port": agent.port, "options": {"profile": "ups-mib"}}],
        nodes=[{"name": "n1", "feeds": ["ups1"]}],
    )
    async with bus.subscribe(*POWER_EVENTS, deliver="all") as sub:
        await sub.start()
        async with trap_monitor(bus, cfg, port, trap_community={"env": "PG_T_COMMUNITY"}):
            first = await asyncio.wait_for(sub.__anext__(), 15)
            assert isinstance(first, PowerStatus)
            agent.set(on_battery=True, runtime_s=600)
            snmptrap("-v2c", "-c", "public", f"127.0.0.1:{port}", "", "1.3.6.1.2.1.33.2.1")
            ev = await next_power_event(sub, timeout=5)
    assert ev.short_type == "power.v1.on_battery" and ev.data.via == "trap" and ev.data.runtime_s == 600


async def test_v3_low_battery_alarm_trap(bus, agent, monkeypatch):
    monkeypatch.setenv("PG_T_AUTH", V3_AUTH)
    monkeypatch.setenv("PG_T_PRIV", V3_PRIV)
    port = free_port()
    cfg = SiteConfig(
        site="dc1",
        ups=[
            {
                "name": "ups1",
                "driver": "snmp",
                "port": agent.port,
                "options": {
                    "version": "3",
                    "user": V3_USER,
                    "auth_key": {"env": "PG_T_AUTH"},
                    "priv_key": {"env": "PG_T_PRIV"},
                    "profile": "ups-mib",
                    "trap_engine_id": ENGINE_ID,
                },
            }
        ],
        nodes=[{"name": "n1", "feeds": ["ups1"]}],
    )
    agent.set(on_battery=True, runtime_s=900)
    async with bus.subscribe(*POWER_EVENTS, deliver="all") as sub:
        await sub.start()
        async with trap_monitor(bus, cfg, port):
            assert (await next_power_event(sub)).short_type == "power.v1.on_battery"  # the first poll
            agent.set(on_battery=True, low_battery=True, runtime_s=100)
            snmptrap(
                "-v3",
                "-e",
                f"0x{ENGINE_ID}",
                "-u",
                V3_USER,
                "-a",
                "SHA",
                "-A",
                V3_AUTH,
                "-x",
                "AES",
                "-X",
                V3_PRIV,
                "-l",
                "authPriv",
                f"127.0.0.1:{port}",
                "",
                "1.3.6.1.2.1.33.2.3",
                "1.3.6.1.2.1.33.1.6.2.1.2.1",
                "o",
                "1.3.6.1.2.1.33.1.6.3.3",
            )
            ev = await next_power_event(sub, timeout=5)
    assert ev.short_type == "power.v1.low_battery" and ev.data.via == "trap"
