"""No outage goes unprotected, against the real coordinator and power-control on a real
nats-server with real (simulated-IPMI) BMCs: a second outage while a restore is stuck on a
dead BMC is checkpointed and shut down at once, by a new saga that carries the stuck restore."""

from __future__ import annotations

import asyncio

import pytest

from powerguard.coordinator.service import Coordinator
from powerguard.power_control.service import PowerControl
from powerguard.schemas import PowerActionFailed, SiteConfig
from powerguard.sim.agents import SimulatedRanks
from tests.integration.power.conftest import make_bmc  # noqa: F401 - the real BMC fixture
from tests.integration.power.helpers import Recorder, creds

from .helpers import POLICY, SagaWatch, drain_battery, eventually, outage, power_back

pytestmark = pytest.mark.integration


def two_node_site(bmcs, cred) -> SiteConfig:
    return SiteConfig.model_validate(
        {
            "site": "dc1",
            "ups": [{"name": "ups-a", "driver": "nut"}],
            "nodes": [
                {"name": n, "feeds": ["ups-a"], "bmc": {"driver": "ipmi", "host": "127.0.0.1", "port": b.port, **cred}}
                for n, b in bmcs.items()
            ],
            "coordinator": {**POLICY, "restore_timeout_s": 300},
            "power_control": {
                "gather_s": 0.1,
                "poll_interval_s": 0.1,
                "soft_off_timeout_s": 2,
                "device_timeout_s": 1.0,
                "retries": 0,
                "readback_s": 60,
            },
        }
    )


async def test_a_second_outage_during_a_stuck_restore_is_checkpointed_and_shut_down(make_bus, make_bmc, monkeypatch):  # noqa: F811
    cred = creds(monkeypatch)
    bmcs = {n: make_bmc(n, boot_delay=0.2, soft_off_delay=0.1) for n in ("n1", "n2")}
    site = two_node_site(bmcs, cred)
    bus, sim_bus, pc_bus, ups_bus = [await make_bus(n) for n in ("coordinator", "sim", "pc", "ups")]
    ranks = SimulatedRanks(sim_bus, {"j1": ["n1", "n1"]}, step=50)
    await ranks.start()
    rec = await Recorder().start(ups_bus)
    watch = await SagaWatch(ups_bus).start()
    pc = PowerControl(pc_bus, site)
    await pc.start()
    coordinator = Coordinator(bus, site, instance="c1")
    stop = asyncio.Event()
    task = asyncio.create_task(coordinator.run(stop))

    def states(saga_id: str) -> list[str]:
        return [e.data.state.value for e in watch.events if e.data.saga_id == saga_id]

    try:
        await outage(ups_bus, 300)
        await watch.reach("holding")
        first = watch.events[0].data.saga_id
        await drain_battery(ups_bus, 40)  # below the reserve: shut down
        await watch.reach("down")
        assert bmcs["n1"].power == bmcs["n2"].power == "off"
        bmcs["n2"].stop()  # its BMC dies while the site is down: n2's power-on will fail
        await power_back(ups_bus)
        await eventually(lambda: rec.of(PowerActionFailed, node="n2", action="on"), 30, "n2's power-on failing")
        await eventually(lambda: bmcs["n1"].power == "on", 30, "n1 on again")
        assert states(first)[-1] == "restoring"  # stuck: it waits for n2 (restore_timeout_s)

        # the UPS goes on battery again, below the reserve, with j1 training on n1
        await outage(ups_bus, 300)
        await eventually(lambda: any(e.data.saga_id != first for e in watch.events), 20, "a new saga")
        second = next(e.data.saga_id for e in watch.events if e.data.saga_id != first)
        await eventually(lambda: "checkpointed" in states(second), 20, f"{second} checkpointed")
        done = next(e for e in watch.events if e.data.saga_id == second and e.data.state.value == "checkpointed")
        assert done.data.reason == "every rank acked" and done.data.jobs == ["j1"]
        await drain_battery(ups_bus, 40)
        await eventually(lambda: bmcs["n1"].power == "off", 30, "n1 shut down by the second saga")
        superseded = [e for e in watch.events if e.data.saga_id == first and e.data.state.value == "failed"]
        assert superseded and superseded[0].data.reason.startswith(f"superseded by {second}")
        await eventually(lambda: set(states(second)) & {"down", "partly_down"}, 60, f"{second} down")
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        await pc.stop()
        await watch.stop()
        await ranks.stop()
