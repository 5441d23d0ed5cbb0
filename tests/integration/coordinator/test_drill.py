"""`powerguard drill --dry-run` against the real coordinator and power-control: real acks from
the agents, the real saga, every power and job command dry-run, the BMC never touched."""

from __future__ import annotations

import asyncio

import pytest

from powerguard.coordinator.service import Coordinator
from powerguard.ops.site_drill import run_site_drill
from powerguard.power_control.service import PowerControl
from powerguard.schemas import ConfigError, PowerData, PowerStatus, SiteConfig
from powerguard.sim.agents import SimulatedRanks
from tests.integration.power.conftest import make_bmc  # noqa: F401 - the real BMC fixture
from tests.integration.power.helpers import creds

from .helpers import POLICY

pytestmark = pytest.mark.integration


def drill_site(bmc, cred) -> SiteConfig:
    return SiteConfig.model_validate(
        {
            "site": "dc1",
            "ups": [{"name": "ups-a", "driver": "nut"}, {"name": "ups-b", "driver": "nut"}],
            "nodes": [
                {
                    "name": "n1",
                    "feeds": ["ups-a"],
                    "bmc": {"driver": "ipmi", "host": "127.0.0.1", "port": bmc.port, **cred},
                },
                {"name": "n2", "feeds": ["ups-a"]},
                {"name": "n3", "feeds": ["ups-a", "ups-b"]},  # A+B: not at risk when only A is on battery
            ],
            "coordinator": {**POLICY, "shutdown_reserve_s": 100, "restore_stable_s": 0.2},
            "power_control": {"gather_s": 0.1, "poll_interval_s": 0.1},
        }
    )


async def test_drill_runs_the_real_saga_with_dry_run_commands(make_bus, make_bmc, monkeypatch):  # noqa: F811
    cred = creds(monkeypatch)
    bmc = make_bmc("n1")
    site = drill_site(bmc, cred)
    bus, sim_bus, pc_bus, drill_bus = [await make_bus(n) for n in ("coordinator", "sim", "pc", "drill")]
    ranks = SimulatedRanks(sim_bus, {"j1": ["n1", "n1", "n2", "n2"], "safe": ["n3", "n3"]}, step=50)
    await ranks.start()
    pc = PowerControl(pc_bus, site)
    await pc.start()
    coordinator = Coordinator(bus, site, instance="c1")
    stop = asyncio.Event()
    task = asyncio.create_task(coordinator.run(stop))
    lines: list[str] = []
    # the UPS's last reading (on line, at 50 % load): the drill takes its load from it. Before: with
    # --runtime-s given it read nothing and printed "load ?%"
    reading = PowerData(site="dc1", ups="ups-a", on_battery=False, runtime_s=1800, charge_pct=100, load_pct=50)
    await sim_bus.publish(PowerStatus(source="/powerguard/ups-monitor", data=reading))
    try:
        result = await asyncio.wait_for(
            run_site_drill(
                drill_bus,
                site,
                "ups-a",
                runtime_s=130,
                speed=20,
                notify=lambda at, text: lines.append(text),
                timeout_s=60,
            ),
            90,
        )
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        await pc.stop()
    assert result.states[-3:] == ["restoring", "resumed", "done"] and "shutting_down" in result.states
    assert result.expected == {"j1": 4}  # the A+B job is not at risk
    assert set(result.acks["j1"]) == {0, 1, 2, 3} and result.complete
    assert not result.not_dry and all("(dry-run)" in c for c in result.commands)
    assert {"shutdown_requested n1", "shutdown_requested n2"} <= {c.removesuffix(" (dry-run)") for c in result.commands}
    assert result.budget_s == pytest.approx(25.0)  # min(30, 130 - 100 - 5)
    assert result.ok and result.load_pct == 50
    assert bmc.power == "on" and not bmc.events()  # nothing reached the real BMC
    assert any("would" in line for line in lines)


async def test_drill_of_a_ups_that_puts_no_node_at_risk_is_refused(make_bus, make_bmc, monkeypatch):  # noqa: F811
    site = drill_site(make_bmc("n1"), creds(monkeypatch))
    drill_bus = await make_bus("drill")
    # no coordinator has published the site's status: the drill knows nothing of the site's feeds
    with pytest.raises(ConfigError, match="no coordinator has published the status of site dc1"):
        await run_site_drill(drill_bus, site, "ups-a", runtime_s=100, notify=lambda *_: None, status_wait_s=0.5)
    stop = asyncio.Event()
    task = asyncio.create_task(Coordinator(await make_bus("coordinator"), site, instance="c1").run(stop))
    try:  # the nodes a UPS alone feeds, as the coordinator publishes them (its topology)
        with pytest.raises(ConfigError, match="nothing to drill"):
            await run_site_drill(drill_bus, site, "ups-b", runtime_s=100, notify=lambda *_: None)
        with pytest.raises(ConfigError, match="feeds no node"):
            await run_site_drill(drill_bus, site, "nope", runtime_s=100, notify=lambda *_: None)
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
