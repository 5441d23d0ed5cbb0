"""The real services, each with its own credential, on a secured deployment."""

from __future__ import annotations

import asyncio
import contextlib

from powerguard.bus import Bus
from powerguard.coordinator.service import Coordinator
from powerguard.power_control.service import PowerControl
from powerguard.schemas import (
    DeadLetter,
    NodeConfig,
    OnBattery,
    PowerData,
    PowerStatus,
    SagaStateChanged,
    SiteConfig,
    UpsConfig,
)

from .conftest import SITE, Deployment, eventually

POLICY = dict(
    ckpt_timeout_s=2,
    shutdown_reserve_s=60,
    margin_s=5,
    restore_stable_s=0.3,
    tick_s=0.05,
    lease_ttl_s=2.0,
    shutdown_timeout_s=20,
    hold_policy="continue",
)


def site() -> SiteConfig:
    return SiteConfig(
        site=SITE,
        ups=[UpsConfig(name="ups-a", driver="nut")],
        nodes=[NodeConfig(name=n, feeds=["ups-a"]) for n in ("n1", "n2")],
        coordinator=POLICY,
        power_control={"dry_run": True, "gather_s": 0.1, "poll_interval_s": 0.1},
    )


def reading(on_battery: bool = True, runtime_s: float = 300) -> PowerData:
    return PowerData(site=SITE, ups="ups-a", on_battery=on_battery, runtime_s=runtime_s, charge_pct=80)


async def outage(ups: Bus, runtime_s: float = 300) -> None:
    await ups.publish(OnBattery(data=reading(True, runtime_s)))


async def drain(ups: Bus, runtime_s: float = 40) -> None:
    await ups.publish(PowerStatus(data=reading(True, runtime_s)))


@contextlib.asynccontextmanager
async def coordinator(dep: Deployment):
    bus = await dep.connect("coordinator")
    c = Coordinator(bus, site(), instance="c1")
    stop = asyncio.Event()
    task = asyncio.create_task(c.run(stop))
    try:
        await eventually(lambda: c.leader and c.consuming, 20, "the coordinator to lead")
        yield c
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)


@contextlib.asynccontextmanager
async def power_control(dep: Deployment):
    bus = await dep.connect("power-control")
    pc = PowerControl(bus, site())
    await pc.start()
    try:
        yield pc
    finally:
        await pc.stop()


@contextlib.asynccontextmanager
async def collected(bus: Bus, kind, subject: str, *, stored: bool = True):
    """The events of ``kind`` on ``subject`` while the block runs, as a list that fills live:
    as stored in the stream (an ephemeral consumer: the observer's way), or with ``stored=False``
    as published (a plain subscription: a job's ranks on their own request subject)."""
    sub = await (bus.subscribe(kind, subject=subject) if stored else bus.listen(kind, subject=subject)).start()
    seen: list = []

    async def follow() -> None:
        async for ev in sub:
            seen.append(ev)

    task = asyncio.create_task(follow())
    try:
        yield seen
    finally:
        task.cancel()


class Watch:
    """What the observer sees: saga states and dead letters (live, ephemeral consumers: the
    observer subscribes to nothing but its inbox)."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.states: list[str] = []
        self.dead: list[DeadLetter] = []
        self._tasks: list[asyncio.Task] = []

    async def start(self) -> Watch:
        s = self.bus.subjects
        sagas = await self.bus.subscribe(SagaStateChanged, subject=s.saga("*")).start()
        dlq = await self.bus.subscribe(DeadLetter, subject=s.dlq("*")).start()

        async def run(sub, sink) -> None:
            async for ev in sub:
                sink(ev)

        self._tasks = [
            asyncio.create_task(run(sagas, lambda e: self.states.append(e.data.state.value))),
            asyncio.create_task(run(dlq, self.dead.append)),
        ]
        return self

    def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
