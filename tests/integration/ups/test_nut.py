"""ups-monitor against a real NUT (upsd + dummy-ups) and a real nats-server."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from powerguard.schemas import POWER_EVENTS, PowerStatus, SiteConfig
from powerguard.ups_monitor.config import MonitorSettings
from powerguard.ups_monitor.nut import NutClient, NutError, UpsUnreachable
from powerguard.ups_monitor.service import Monitor
from tests.waiting import eventually

from .nut_peer import NutServer, free_port

pytestmark = pytest.mark.integration
SETTINGS = MonitorSettings(poll_interval_s=0.1, comm_timeout_s=1.0, status_every_s=60, timeout_s=1.0)


@pytest.fixture
def nut(tmp_path):
    server = NutServer(tmp_path).start()
    yield server
    server.stop()


def site(port: int, **options) -> SiteConfig:
    return SiteConfig(
        site="dc1",
        ups=[{"name": "ups1", "driver": "nut", "port": port, "options": options}],
        nodes=[{"name": "n1", "feeds": ["ups1"]}],
    )


@contextlib.asynccontextmanager
async def monitoring(bus, cfg: SiteConfig, instance: str = "m1", settings: MonitorSettings = SETTINGS):
    stop = asyncio.Event()
    monitor = Monitor(bus, cfg, settings=settings, instance=instance)
    task = asyncio.create_task(monitor.run(stop))
    try:
        yield monitor
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


async def next_power_event(sub, timeout: float = 15):
    async def get():
        async for ev in sub:
            if not isinstance(ev, PowerStatus):
                return ev

    return await asyncio.wait_for(get(), timeout)


async def test_ol_ob_lb_ol_gives_the_exact_event_sequence(bus, nut):
    async with bus.subscribe(*POWER_EVENTS, deliver="all") as sub:
        await sub.start()
        async with monitoring(bus, site(nut.port)):
            first = await asyncio.wait_for(sub.__anext__(), 15)
            assert isinstance(first, PowerStatus) and not first.data.on_battery
            assert (first.data.charge_pct, first.data.runtime_s, first.data.load_pct, first.data.input_v) == (
                100,
                1800,
                40,
                230,
            )
            nut.set_status("OB DISCHRG", **{"battery.runtime": 600, "battery.charge": 80})
            ev = await next_power_event(sub)
            assert ev.short_type == "power.v1.on_battery" and ev.data.on_battery and ev.data.ups == "ups1"
            nut.set_status("OB DISCHRG LB", **{"battery.runtime": 90})
            ev = await next_power_event(sub)
            assert ev.short_type == "power.v1.low_battery" and ev.data.runtime_s == 90 and "LB" in ev.data.status
            nut.set_status("OL CHRG")
            ev = await next_power_event(sub)
            assert ev.short_type == "power.v1.on_line" and not ev.data.on_battery
            assert ev.data.site == "dc1" and ev.data.driver == "nut" and ev.data.via == "poll"


async def test_two_monitors_put_one_event_per_transition(make_bus, nut):
    a, b = await make_bus("ups-monitor-a"), await make_bus("ups-monitor-b")
    async with a.subscribe(*POWER_EVENTS, deliver="all") as sub:
        await sub.start()
        async with monitoring(a, site(nut.port), "m1"), monitoring(b, site(nut.port), "m2"):
            nut.set_status("OB DISCHRG")
            ev = await next_power_event(sub)
            assert ev.short_type == "power.v1.on_battery"
            nut.set_status("OL CHRG")
            ev = await next_power_event(sub)
            assert ev.short_type == "power.v1.on_line"  # not a second on_battery
        info = await a.js.stream_info(a.names.stream, subjects_filter=a.subjects.power("dc1", "ups1"))
    kinds = []
    async with a.subscribe(*POWER_EVENTS, deliver="all") as again:
        await again.start()
        while len(kinds) < info.state.messages:
            kinds.append((await asyncio.wait_for(again.__anext__(), 5)).short_type)
    transitions = [k for k in kinds if k != "power.v1.status"]
    assert transitions == ["power.v1.on_battery", "power.v1.on_line"]


async def test_unreachable_ups_gives_comm_lost_and_never_on_battery(bus, tmp_path):
    async with bus.subscribe(*POWER_EVENTS, deliver="all") as sub:
        await sub.start()
        async with monitoring(bus, site(free_port())):
            ev = await next_power_event(sub)
    assert ev.short_type == "power.v1.comm_lost" and not ev.data.on_battery
    assert "unreachable" in ev.data.reason


async def test_comm_restored_when_upsd_comes_back(bus, tmp_path):
    server = NutServer(tmp_path)
    async with bus.subscribe(*POWER_EVENTS, deliver="all") as sub:
        await sub.start()
        async with monitoring(bus, site(server.port)):
            assert (await next_power_event(sub)).short_type == "power.v1.comm_lost"
            server.start()
            try:
                assert (await next_power_event(sub)).short_type == "power.v1.comm_restored"
            finally:
                server.stop()


async def test_nut_errors_are_clear(nut):
    client = NutClient("127.0.0.1", nut.port)
    with pytest.raises(NutError, match=r"UNKNOWN-UPS.*check ups_name"):
        await client.get_var("nope", "ups.status")
    await client.close()
    bad = NutClient("127.0.0.1", nut.port, user="admin", password="wrong")
    with pytest.raises(NutError, match=r"ACCESS-DENIED.*wrong user/password"):  # upsd checks it on use
        await bad.set_var("ups1", "ups.status", "OL")
    await bad.close()
    with pytest.raises(UpsUnreachable, match="unreachable"):
        await NutClient("127.0.0.1", free_port(), timeout=0.5).connect()


async def test_a_transition_the_server_did_not_store_is_published_again_once_it_can(bus, nut):
    """The stream is gone when the UPS goes on battery (the server stores nothing: a burst, a
    broker restart); ups-monitor publishes the same on_battery again at every poll until the
    server stores it, then its current state. (It was logged and lost: the coordinator saw the
    outage only from later telemetry, if at all.)"""
    settings = MonitorSettings(poll_interval_s=0.2, comm_timeout_s=5.0, status_every_s=60, timeout_s=1.0)
    async with bus.subscribe(*POWER_EVENTS, deliver="all") as sub:
        await sub.start()
        async with monitoring(bus, site(nut.port), settings=settings) as monitor:
            assert isinstance(await asyncio.wait_for(sub.__anext__(), 15), PowerStatus)
            for stream in bus.names.streams:
                await bus.js.delete_stream(stream)
            nut.set_status("OB DISCHRG", **{"battery.runtime": 600})
            await eventually(lambda: monitor.targets[0].unsent, 30, "the on_battery kept as unsent")
            await bus.setup()  # the server stores again
            await eventually(lambda: not monitor.targets[0].unsent, 30, "the on_battery published again")
    async with bus.subscribe(*POWER_EVENTS, deliver="all") as again:
        await again.start()
        kinds = [(await asyncio.wait_for(again.__anext__(), 10)).short_type for _ in range(2)]
    assert kinds[0] == "power.v1.on_battery" and kinds[1] == "power.v1.status", kinds
