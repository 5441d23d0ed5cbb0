"""Shared pieces of the coordinator integration tests."""

from __future__ import annotations

import asyncio

import yaml

from powerguard.bus import Bus
from powerguard.coordinator.policy import Policy
from powerguard.schemas import (
    NodeConfig,
    OnBattery,
    OnLine,
    PowerData,
    PowerStatus,
    SagaStateChanged,
    SiteConfig,
    UpsConfig,
)
from tests.waiting import eventually

JOBS = {"j1": ["n1", "n1", "n2", "n2"], "j2": ["n3", "n3", "n4", "n4"]}
NODES = ["n1", "n2", "n3", "n4"]
POLICY = dict(
    ckpt_timeout_s=30,
    shutdown_reserve_s=60,
    margin_s=5,
    restore_stable_s=0.3,
    min_restart_charge_pct=20,
    shutdown_timeout_s=30,
    restore_timeout_s=60,
    tick_s=0.05,
    lease_ttl_s=2.0,
)


def site(nodes: list[str] | None = None, **nats) -> SiteConfig:
    return SiteConfig(
        site="dc1",
        nats=nats or {},
        ups=[UpsConfig(name="ups-a", driver="nut")],
        nodes=[NodeConfig(name=n, feeds=["ups-a"]) for n in nodes or NODES],
        coordinator=POLICY,
    )


def site_file(path, names, nodes: list[str] | None = None):
    """A site YAML for a coordinator process on these isolated bus names; returns its path."""
    cfg = site(
        nodes,
        prefix=names.prefix,
        stream=names.stream,
        sagas_bucket=names.sagas,
        status_bucket=names.status,
        agents_bucket=names.agents,
        leases_bucket=names.leases,
    )
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    return path


def policy() -> Policy:
    return Policy(**POLICY)


def power(on_battery: bool, runtime_s: float = 300.0, charge: float = 80.0) -> PowerData:
    return PowerData(site="dc1", ups="ups-a", on_battery=on_battery, runtime_s=runtime_s, charge_pct=charge)


async def outage(bus: Bus, runtime_s: float = 300.0) -> OnBattery:
    event = OnBattery(source="/powerguard/ups-monitor", data=power(True, runtime_s))
    await bus.publish(event)
    return event


async def drain_battery(bus: Bus, runtime_s: float = 40.0, *, timeout: float = 10.0) -> None:
    await bus.publish(PowerStatus(source="/powerguard/ups-monitor", data=power(True, runtime_s)), timeout=timeout)


async def power_back(bus: Bus, *, timeout: float = 10.0) -> None:
    await bus.publish(OnLine(source="/powerguard/ups-monitor", data=power(False, 600, 90)), timeout=timeout)


class SagaWatch:
    """Collects saga state changes from the bus."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.states: list[str] = []
        self.events: list[SagaStateChanged] = []
        self._task: asyncio.Task | None = None
        self._sub = None

    async def start(self) -> SagaWatch:
        self._sub = self.bus.subscribe(SagaStateChanged, deliver="all")
        await self._sub.start()
        self._task = asyncio.create_task(self._run())
        return self

    async def _run(self) -> None:
        async for ev in self._sub:
            if ev.id not in {e.id for e in self.events}:
                self.events.append(ev)
                self.states.append(ev.data.state.value)

    async def reach(self, state: str, timeout: float = 20.0) -> None:
        await eventually(lambda: state in self.states, timeout, f"saga state {state} (seen {self.states})")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
        if self._sub:
            await self._sub.aclose()
