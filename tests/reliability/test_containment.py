"""Failures are contained and reported (docs/reliability.md): one bad UPS, one poison message,
one broken device never stops the rest, and never fails silently. Real peers (snmpd, NUT,
nats-server, the simulated BMC's real IPMI)."""

from __future__ import annotations

import asyncio
import contextlib
import json

import pytest

from powerguard.schemas import POWER_EVENTS, MalformedEvent, PowerStatus, SiteConfig, UnknownEventType, decode
from powerguard.ups_monitor.config import MonitorSettings
from powerguard.ups_monitor.service import Monitor
from tests.integration.ups.snmp_peer import SnmpUps

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_poison_payloads_raise_only_event_errors():
    deep = b'{"type": "io.powerguard.power.v1.status", "data": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with pytest.raises(MalformedEvent, match="nests"):
        decode(deep)
    quoted = json.dumps({"type": "x", "data": "[" * 5000}).encode()  # brackets inside a string are text
    with pytest.raises(UnknownEventType, match="unknown event type 'x'"):  # past the nesting guard: the type
        decode(quoted)
    huge = {
        "type": "io.powerguard.agent.v1.registered",
        "source": "/x",
        "data": {"job": "j", "rank": 0, "world_size": 10**12, "node": "n1"},
    }
    with pytest.raises(MalformedEvent, match="world_size"):
        decode(json.dumps(huge))
    huge["data"].update(world_size=4, rank=4)
    with pytest.raises(MalformedEvent, match="rank 4 is not below world_size 4"):
        decode(json.dumps(huge))


@contextlib.asynccontextmanager
async def monitor(bus, cfg: SiteConfig):
    settings = MonitorSettings(poll_interval_s=0.2, status_every_s=0.5, comm_timeout_s=30, timeout_s=1.0)
    stop = asyncio.Event()
    m = Monitor(bus, cfg, settings=settings, instance="m1")
    task = asyncio.create_task(m.run(stop))
    try:
        yield m
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
    assert not task.cancelled() and task.exception() is None  # it never died


async def test_one_ups_reporting_garbage_or_unconfigurable_does_not_stop_the_others(bus, tmp_path, monkeypatch):
    (tmp_path / "bad").mkdir()
    (tmp_path / "good").mkdir()
    bad, good = SnmpUps(tmp_path / "bad").start(), SnmpUps(tmp_path / "good").start()
    try:
        bad.set(on_battery=True, charge=255, runtime_s=600)  # a broken agent: charge 255 %
        cfg = SiteConfig(
            site="dc1",
            ups=[
                {"name": "bad", "driver": "snmp", "port": bad.port, "options": {"profile": "ups-mib"}},
                {"name": "good", "driver": "snmp", "port": good.port, "options": {"profile": "ups-mib"}},
                {
                    "name": "nosecret",
                    "driver": "snmp",
                    "port": good.port,
                    "options": {"profile": "ups-mib", "community": {"env": "PG_T_NOT_SET"}},
                },
            ],
            nodes=[{"name": "n1", "feeds": ["bad", "good", "nosecret"]}],
        )
        seen: dict[str, list] = {}
        async with bus.subscribe(*POWER_EVENTS, deliver="new") as sub:
            await sub.start()
            async with monitor(bus, cfg) as m:
                assert "nosecret" in m.unwatched and "PG_T_NOT_SET" in m.unwatched["nosecret"]
                good.set(on_battery=True, runtime_s=900)

                async def collect() -> None:
                    async for ev in sub:
                        seen.setdefault(ev.data.ups, []).append(ev)
                        if "bad" in seen and any(e.short_type == "power.v1.on_battery" for e in seen.get("good", [])):
                            return

                await asyncio.wait_for(collect(), 20)
        bad_events = seen["bad"]
        assert all(e.data.charge_pct is None for e in bad_events)  # the garbage value is dropped ...
        assert any(e.data.partial for e in bad_events)  # ... and the reading says it is partial
        assert any(isinstance(e, PowerStatus) or e.data.on_battery for e in bad_events)
    finally:
        bad.stop()
        good.stop()
