"""An outage longer than the battery, to its last step, against the real coordinator and
power-control on a real nats-server and Debian's real upsd: once the compute node is off and
the job's checkpoint durable, the saga shuts the storage node down, then tells the UPS to cut
its output and return (NUT shutdown.return through upsd, as its upsd.users permits), then
shuts PowerGuard's own (management) host down; the UPS cuts its output; mains returns, the UPS
turns it on, and only then, once the UPS could cycle its output, is every node powered on."""

from __future__ import annotations

import asyncio

import pytest

from powerguard.bus.saga_status import saga_status
from powerguard.coordinator.service import Coordinator
from powerguard.power_control.service import PowerControl
from powerguard.schemas import SiteConfig, UpsOutputResult
from powerguard.sim.agents import SimulatedRanks
from tests.integration.power.helpers import Recorder
from tests.integration.ups.nut_peer import require_nut

from .helpers import POLICY, SagaWatch, drain_battery, eventually, outage, power_back

pytestmark = pytest.mark.integration

USERS = "[pg]\n password = pgsecret\n instcmds = shutdown.return\n instcmds = shutdown.stop\n"


def site(ups_port: int, **policy) -> SiteConfig:
    return SiteConfig.model_validate(
        {
            "site": "dc1",
            "ups": [
                {
                    "name": "ups-a",
                    "driver": "nut",
                    "host": "127.0.0.1",
                    "port": ups_port,
                    "options": {"ups_name": "ups1"},
                    "control": {"username": {"env": "PG_TEST_UPS_USER"}, "password": {"env": "PG_TEST_UPS_PASSWORD"}},
                }
            ],
            "nodes": [
                {"name": "n1", "feeds": ["ups-a"], "bmc": {"driver": "dry-run"}},
                {"name": "s1", "feeds": ["ups-a"], "bmc": {"driver": "dry-run"}, "role": "storage"},
                {"name": "m1", "feeds": ["ups-a"], "bmc": {"driver": "dry-run"}, "role": "management"},
            ],
            "coordinator": {**POLICY, **policy},
            "power_control": {"gather_s": 0.1, "poll_interval_s": 0.1, "soft_off_timeout_s": 2, "readback_s": 60},
        }
    )


async def test_the_ups_is_told_once_everything_is_down_and_durable_and_the_restore_waits_for_its_cycle(
    make_bus, tmp_path, monkeypatch
):
    require_nut()
    from powerguard.sim.nut_driver import NutDriverUps

    monkeypatch.setenv("PG_TEST_UPS_USER", "pg")
    monkeypatch.setenv("PG_TEST_UPS_PASSWORD", "pgsecret")
    ups = NutDriverUps(tmp_path, delay_shutdown_s=5, delay_start_s=0.3, users=USERS).start()
    cfg = site(ups.port, ups_off=True, ups_off_delay_s=1, ups_off_runtime_s=60, ups_off_return_s=2)
    bus, sim_bus, pc_bus, obs_bus = [await make_bus(n) for n in ("coordinator", "sim", "pc", "obs")]
    ranks = SimulatedRanks(sim_bus, {"j1": ["n1", "n1"]}, step=50)
    await ranks.start()
    rec = await Recorder().start(obs_bus)
    watch = await SagaWatch(obs_bus).start()
    pc = PowerControl(pc_bus, cfg)
    await pc.start()
    stop = asyncio.Event()
    task = asyncio.create_task(Coordinator(bus, cfg, instance="c1").run(stop))
    try:
        ups.mains(False)
        await outage(obs_bus, 300)
        await watch.reach("holding")  # j1's ranks acked: durable
        assert not ups.events("instcmd shutdown.return 1")  # on battery with a long runtime: nothing to cut
        await drain_battery(obs_bus, 40)  # below the reserve: the shutdown, then the last step
        await watch.reach("down")
        await rec.wait(lambda: rec.of(UpsOutputResult), what="the UPS's answer")
        (res,) = rec.of(UpsOutputResult)
        assert res.data.ok and res.data.detail == "shutdown.return done by the UPS (ups1)", res.data
        await eventually(lambda: ups.events("output off"), 10, "the UPS's output off")
        assert [w for _, w in ups.events() if w.startswith("instcmd")] == ["instcmd shutdown.return 1"]

        ups.mains(True)
        await power_back(obs_bus)
        await eventually(lambda: ups.events("output on"), 10, "the output back with mains")
        await watch.reach("restoring", timeout=30)
        await rec.wait(lambda: all("ready" in rec.states(n) for n in ("n1", "s1", "m1")), what="every node ready")
        saga = watch.events[-1].data.saga_id
        kv = await obs_bus.sagas()
        record = (await kv.get(obs_bus.names.saga_key(saga))).json()
        told = record["ups_off"]["ups-a"]
        assert told["done_at"] is not None and told["reason"].startswith("runtime 40s at or below 61s"), told
        # the power-on came only once the UPS could cycle its output (delay 1 s + ups_off_return_s 2 s)
        assert record["restore_started_at"] >= told["told_at"] + 3.0
        # the last stage's order: the compute node, the storage node off; the UPS told; our own host
        nodes = record["nodes"]
        assert nodes["n1"]["off_at"] <= nodes["s1"]["shutdown_at"] <= nodes["s1"]["off_at"] <= told["told_at"]
        assert told["told_at"] <= nodes["m1"]["shutdown_at"] and told["nodes"] == ["n1", "s1"]
        assert all(nodes[n].get("power_on_at") for n in ("n1", "s1", "m1")), nodes  # every load restored
        # what `powerguard status` and the console show of the stage
        status = await eventually(lambda: saga_status(obs_bus, saga), 10, "the saga's published status")
        shown = status.ups_off
        assert shown["ups-a"].startswith("told at +") and "(the UPS confirmed)" in shown["ups-a"], shown
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        await pc.stop()
        await watch.stop()
        await ranks.stop()
        ups.stop()
