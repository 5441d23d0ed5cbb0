"""The operator console against a real nats-server: state from events, agent records and saga
records; the page's data stays right across a NATS restart (the feed reconnects and reads KV
again) and a coordinator restart (a new leader's saga record is simply read); it never publishes."""

from __future__ import annotations

import asyncio
import base64

import aiohttp
import pytest

from powerguard.bus import Bus, BusNames, EmbeddedNats
from powerguard.cli.console import start_console
from powerguard.coordinator.service import Coordinator
from powerguard.schemas import OnBattery, OnLine, PowerData
from tests.waiting import eventually

from .coordinator.helpers import SagaWatch, policy, site

pytestmark = pytest.mark.integration


def power(on_battery: bool, runtime: float) -> PowerData:
    return PowerData(site="dc1", ups="ups-a", on_battery=on_battery, charge_pct=80.0, runtime_s=runtime, driver="snmp")


async def state(session: aiohttp.ClientSession, url: str) -> dict:
    async with session.get(url + "api/state") as r:
        assert r.status == 200
        return await r.json()


async def until(session, url, cond, what: str, timeout: float = 30.0) -> dict:
    async def seen() -> dict | None:
        s = await state(session, url)
        return s if cond(s) else None

    return await eventually(seen, timeout, what, every=0.2)


async def test_console_follows_the_site_across_a_nats_restart_and_a_coordinator_restart(tmp_path):
    server = EmbeddedNats(store_dir=tmp_path / "nats").start()
    names = BusNames()
    bus = await Bus.connect(server.url, service="test", names=names)  # sets up the stream and buckets
    stop_console, url = await start_console(url=server.url, site=None, port=0)
    coordinator = Coordinator(bus, site(), policy=policy(), instance="c1")
    stop = asyncio.Event()
    task = asyncio.create_task(coordinator.run(stop))
    watch = await SagaWatch(bus).start()
    try:
        async with aiohttp.ClientSession() as session:
            await until(session, url, lambda s: s["bus_connected"], "the console to connect")
            await bus.publish(OnBattery(source="/test", data=power(True, 900)))
            s = await until(session, url, lambda s: s["saga"] is not None, "the open saga")
            assert s["ups"][0]["on_battery"] is True and s["ups"][0]["runtime_s"] == 900
            saga = s["saga"]["saga"]

            server.stop()  # NATS goes away ...
            await until(session, url, lambda s: not s["bus_connected"], "the console to see the bus down")
            server.start()  # ... and comes back on the same port and store
            await until(session, url, lambda s: s["bus_connected"], "the console to reconnect", timeout=60)
            await until(session, url, lambda s: s["saga"] and s["saga"]["saga"] == saga, "the saga read again")

            stop.set()  # the coordinator restarts: a new instance takes the saga over
            await asyncio.wait_for(task, 30)
            stop = asyncio.Event()
            coordinator = Coordinator(bus, site(), policy=policy(), instance="c2")
            task = asyncio.create_task(coordinator.run(stop))
            await bus.publish(OnLine(source="/test", data=power(False, 900)))  # after the reconnect: live again
            s = await until(session, url, lambda s: s["ups"][0]["on_battery"] is False, "the on_line event")
            await until(
                session,
                url,
                lambda s: s["saga"] is None and any(p["saga"] == saga for p in s["past"]),
                "the saga closed by the new coordinator",
                timeout=90,
            )
            async with session.get(f"{url}api/sagas/{saga}/timeline.svg") as r:
                assert r.status == 200 and "<svg" in await r.text()
            texts = [t["text"] for t in (await state(session, url))["timeline"]]
            assert any("on_line" in t for t in texts)
    finally:
        stop.set()
        await stop_console()
        await watch.stop()
        await asyncio.wait_for(task, 30)
        await bus.close()
        server.stop()


async def test_console_token_is_required_when_set(nats_server, names):
    bus = await Bus.connect(nats_server.url, service="test", names=names)
    stop_console, url = await start_console(url=nats_server.url, site=None, port=0, token="s3cret")
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(url + "api/state") as r:
                assert r.status == 401 and "Basic" in r.headers["WWW-Authenticate"]
            async with session.get(url + "api/state", headers={"Authorization": "Bearer wrong"}) as r:
                assert r.status == 401
            async with session.get(url + "api/state", headers={"Authorization": "Bearer s3cret"}) as r:
                assert r.status == 200
            basic = {"Authorization": "Basic " + base64.b64encode(b"ops:s3cret").decode()}
            async with session.get(url + "api/state", headers=basic) as r:
                assert r.status == 200
    finally:
        await stop_console()
        await bus.close()
