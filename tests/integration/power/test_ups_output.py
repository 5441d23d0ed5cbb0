"""A UPS told to cut its output and return (the last step of an outage longer than the
battery), through Debian's real upsd: the UPS is the simulated one speaking NUT's driver socket
protocol (``dummy-ups`` does not implement ``shutdown.return``), so upsd's own permission
checks and command tracking are what power-control meets."""

from __future__ import annotations

import pytest

from powerguard.power_control.drivers.base import Guarded
from powerguard.power_control.drivers.ups_nut import NutUpsOutput
from powerguard.power_control.errors import CommandRejected
from tests.integration.ups.nut_peer import require_nut
from tests.waiting import eventually, eventually_sync

pytestmark = pytest.mark.integration

USERS = (
    "[pg]\n password = pgsecret\n instcmds = shutdown.return\n instcmds = shutdown.stop\n"
    "[monitor]\n password = mon\n upsmon primary\n"
)


@pytest.fixture
def ups(tmp_path):
    require_nut()
    from powerguard.sim.nut_driver import NutDriverUps

    u = NutDriverUps(tmp_path, delay_shutdown_s=0.5, delay_start_s=0.3, users=USERS).start()
    yield u
    u.stop()


def output(ups, user: str = "pg", password: str = "pgsecret") -> NutUpsOutput:
    return NutUpsOutput(
        "ups:ups1",
        Guarded("ups:ups1", timeout_s=10),
        host="127.0.0.1",
        port=ups.port,
        ups="ups1",
        user=user,
        password=password,
    )


def wait(pred, what: str, timeout: float = 10.0) -> None:
    eventually_sync(pred, timeout, what)


async def test_shutdown_return_cuts_the_output_after_the_delay_and_mains_brings_it_back(ups):
    ups.mains(False)
    said = await output(ups).shutdown_return(1)
    assert said == "shutdown.return done by the UPS (ups1)"  # the driver's own result, through upsd's tracking
    wait(lambda: ups.events("output off"), "the output off")
    (asked, _), (off, _) = ups.events("instcmd shutdown.return 1")[0], ups.events("output off")[0]
    assert 0.9 <= off - asked < 3.0  # after the delay it was given
    assert not ups.output_on
    ups.mains(True)
    wait(lambda: ups.events("output on"), "the output back with mains")
    (mains, _), (on, _) = ups.events("mains on")[0], ups.events("output on")[0]
    assert on - mains >= 0.25 and ups.output_on  # ups.delay.start after mains returned


async def test_a_user_without_the_instcmd_permission_is_refused_naming_the_setting(ups):
    with pytest.raises(CommandRejected, match=r"upsd.users needs 'instcmds = shutdown.return' in \[monitor\]"):
        await output(ups, "monitor", "mon").shutdown_return(1)
    # upsd refused it before its driver saw anything; the permitted user's command is the first it sees
    await output(ups).cancel()
    assert [what for _, what in ups.events() if what.startswith("instcmd")] == ["instcmd shutdown.stop"]
    assert ups.output_on


async def test_a_ups_that_does_not_offer_the_command_is_refused_before_anything_is_sent(tmp_path):
    require_nut()
    from powerguard.sim.nut_driver import NutDriverUps

    u = NutDriverUps(tmp_path, commands=("load.off",), users=USERS).start()
    try:
        with pytest.raises(CommandRejected, match=r"does not offer shutdown.return \(it lists: load.off\)"):
            await output(u).shutdown_return(1)
        assert not u.events() and u.output_on
    finally:
        u.stop()


# ------------------------------------------------------------------ power-control, as a service
def ups_site(ups, *, control: bool = True, **settings):
    from .helpers import site

    cfg = site([{"name": "n1", "bmc": {"driver": "dry-run"}}], **settings)
    entry = {"name": "ups-a", "driver": "nut", "host": "127.0.0.1", "port": ups.port, "options": {"ups_name": "ups1"}}
    if control:
        entry["control"] = {"username": {"env": "PG_TEST_UPS_USER"}, "password": {"env": "PG_TEST_UPS_PASSWORD"}}
    return cfg.model_copy(update={"ups": [type(cfg.ups[0]).model_validate(entry)]})


def ups_off(saga: str = "saga-1", **kw):
    from powerguard.schemas import UpsOutputCommandData, UpsOutputOffRequested

    data = UpsOutputCommandData(
        saga_id=saga, ups="ups-a", idempotency_key=f"{saga}/ups:ups-a/output_off", delay_s=1, **kw
    )
    return UpsOutputOffRequested(data=data)


async def down_saga(bus, saga: str = "saga-1", state: str = "down") -> None:
    from .helpers import announce_saga

    await announce_saga(bus, saga, state)


async def test_power_control_tells_the_ups_through_upsd_and_reports_what_it_said(ups, make_bus, monkeypatch):
    from powerguard.schemas import UpsOutputResult

    from .helpers import Recorder, service

    monkeypatch.setenv("PG_TEST_UPS_USER", "pg")
    monkeypatch.setenv("PG_TEST_UPS_PASSWORD", "pgsecret")
    bus = await make_bus("power-control")
    rec = await Recorder().start(bus)
    await down_saga(bus)
    pc = await service(bus, ups_site(ups, require_saga=True))
    try:
        ups.mains(False)
        await bus.publish(ups_off())
        await rec.wait(lambda: rec.of(UpsOutputResult), what="the UPS's answer")
        (res,) = rec.of(UpsOutputResult)
        assert res.data.ok and res.data.detail == "shutdown.return done by the UPS (ups1)", res.data
        assert res.data.saga_id == "saga-1" and not res.data.dry_run
        wait(lambda: ups.events("output off"), "the output off")
        ups.mains(True)
        wait(lambda: ups.events("output on"), "the output back with mains")
        # a redelivery is a duplicate: the UPS sees one command, the ledger says so
        await bus.publish(ups_off())
        await down_saga(bus, "saga-2", state="restoring")  # mains is back: that saga restores
        await bus.publish(ups_off("saga-2"))
        await rec.wait(lambda: len(rec.of(UpsOutputResult)) == 2, what="the second saga's refusal")
        refused = rec.of(UpsOutputResult)[1]
        assert not refused.data.ok and "saga saga-2 is restoring" in refused.data.error
        assert [w for _, w in ups.events() if w.startswith("instcmd")] == ["instcmd shutdown.return 1"]
    finally:
        await pc.stop()


async def test_a_ups_without_a_control_credential_is_never_told_and_the_result_says_why(ups, make_bus):
    from powerguard.schemas import UpsOutputResult

    from .helpers import Recorder, service

    bus = await make_bus("power-control")
    rec = await Recorder().start(bus)
    await down_saga(bus)
    pc = await service(bus, ups_site(ups, control=False))
    try:
        ups.mains(False)
        await bus.publish(ups_off())
        await rec.wait(lambda: rec.of(UpsOutputResult), what="the failure")
        (res,) = rec.of(UpsOutputResult)
        assert not res.data.ok and "no 'control' credential in the site file" in res.data.error
        assert not [w for _, w in ups.events() if w.startswith("instcmd")] and ups.output_on
    finally:
        await pc.stop()


# ------------------------------------------------------------------ SNMP: UPS-MIB's upsControl group
async def _snmp_ups():
    from powerguard.sim.ups import Battery, Output, ups_agent

    battery = Battery(load=lambda: 40.0, on_battery=True)
    output = Output(mains=lambda: not battery.on_battery, startup_delay_s=0.3)
    agent = ups_agent(battery, output=output, write_community="private")
    await agent.start("127.0.0.1", 0)
    return battery, output, agent


def snmp_output(agent, profile: str = "auto"):
    """power-control's driver for the agent, from a site file whose control community is in the environment."""
    from powerguard.power_control.ups_output import UpsOutputs
    from powerguard.schemas import SiteConfig

    cfg = SiteConfig.model_validate(
        {
            "site": "dc1",
            "ups": [
                {
                    "name": "ups-a",
                    "driver": "snmp",
                    "port": agent.port,
                    "options": {"profile": profile},
                    "control": {"options": {"community": {"env": "PG_TEST_UPS_COMMUNITY"}}},
                }
            ],
            "nodes": [{"name": "n1", "feeds": ["ups-a"]}],
        }
    )
    return UpsOutputs(cfg, timeout_s=10).driver("ups-a")


async def test_ups_mib_shutdown_after_delay_with_auto_restart_cuts_and_restores_the_output(monkeypatch):
    monkeypatch.setenv("PG_TEST_UPS_COMMUNITY", "private")
    battery, output, agent = await _snmp_ups()
    try:
        said = await snmp_output(agent).shutdown_return(1)
        assert said.startswith("upsShutdownAfterDelay counting down (1 s left), upsAutoRestart on"), said
        await eventually(lambda: not output.is_on(), 10, "the output to go off")
        (asked,) = [t for t, w in output.log if w == "shutdown after 1"]
        assert 0.9 <= output.events("output off")[0] - asked < 3.0
        battery.set_on_battery(False)  # mains returns: with upsAutoRestart on, the output comes back
        await eventually(output.is_on, 10, "the output to come back")
    finally:
        agent.stop()


async def test_ups_mib_with_the_read_only_community_is_refused_naming_the_write_credential(monkeypatch):
    monkeypatch.setenv("PG_TEST_UPS_COMMUNITY", "public")
    _, output, agent = await _snmp_ups()
    try:
        with pytest.raises(CommandRejected, match=r"needs its write community"):
            await snmp_output(agent).shutdown_return(1)
        assert output.is_on() and output.seconds_to_shutdown() == -1 and not output.log
    finally:
        agent.stop()


async def test_a_node_found_on_when_its_ups_is_to_be_told_stops_the_command(ups, make_bus, monkeypatch):
    """The saga counts n1 off, but someone powered it on by hand since (power-control's read-back
    watches only nodes whose command has not reached its result): power-control reads every node
    that would lose power first, and refuses while one is on."""
    from powerguard.schemas import UpsOutputResult

    from .helpers import Recorder, service

    monkeypatch.setenv("PG_TEST_UPS_USER", "pg")
    monkeypatch.setenv("PG_TEST_UPS_PASSWORD", "pgsecret")
    bus = await make_bus("power-control")
    rec = await Recorder().start(bus)
    await down_saga(bus)
    await down_saga(bus, "saga-2")
    pc = await service(bus, ups_site(ups))
    try:
        ups.mains(False)
        pc.seq.devices.bmc("n1").state = "on"  # the dry-run BMC: on again
        await bus.publish(ups_off(nodes=["n1"]))
        await rec.wait(lambda: rec.of(UpsOutputResult), what="the refusal")
        (res,) = rec.of(UpsOutputResult)
        assert not res.data.ok and res.data.error.startswith("not told: n1 on (read now"), res.data
        pc.seq.devices.bmc("n1").state = "off"  # off again: the next saga's command goes through
        await bus.publish(ups_off("saga-2", nodes=["n1"]))
        await rec.wait(lambda: len(rec.of(UpsOutputResult)) == 2, what="the UPS's answer")
        assert rec.of(UpsOutputResult)[1].data.ok
        assert [w for _, w in ups.events() if w.startswith("instcmd")] == ["instcmd shutdown.return 1"]
    finally:
        await pc.stop()


async def test_apc_powernet_conserve_battery_sleeps_the_ups_on_battery_and_is_refused_on_line(monkeypatch):
    """APC PowerNet's way: upsAdvConfigShutoffDelay, then upsBasicControlConserveBattery
    turnOffUpsToConserveBattery(2): asleep after the delay, on again with mains; the agent
    refuses it while the UPS is on line (nothing to conserve)."""
    monkeypatch.setenv("PG_TEST_UPS_COMMUNITY", "private")
    battery, output, agent = await _snmp_ups()
    try:
        battery.set_on_battery(False)
        with pytest.raises(CommandRejected, match=r"wrongValue to SET upsBasicControlConserveBattery"):
            await snmp_output(agent, "apc").shutdown_return(1)
        assert output.is_on() and output.seconds_to_shutdown() == -1
        battery.set_on_battery(True)
        said = await snmp_output(agent, "apc").shutdown_return(1)
        assert said.endswith("(APC PowerNet)") and output.auto_restart, said
        await eventually(lambda: not output.is_on(), 10, "the UPS to go to sleep")
        battery.set_on_battery(False)
        await eventually(output.is_on, 10, "the UPS to wake with mains")
    finally:
        agent.stop()


async def test_an_apcupsd_ups_is_told_through_the_sites_command_with_the_delay_and_its_exit_counts(
    tmp_path, monkeypatch
):
    """apcupsd's killpower runs on the host wired to the UPS: the site gives the argv (no shell);
    power-control runs it with the UPS and the delay in its environment, never its credentials."""
    from powerguard.power_control.ups_output import UpsOutputs
    from powerguard.schemas import SiteConfig

    monkeypatch.setenv("PG_TEST_SECRET", "must-not-leak")
    seen = tmp_path / "killpower.env"
    script = tmp_path / "killpower.sh"
    script.write_text(
        f'#!/bin/sh\nenv > {seen}\n[ "$POWERGUARD_DELAY_S" = 30 ] || exit 3\necho "apcupsd: killpower armed"\n'
    )
    script.chmod(0o755)

    def driver(argv):
        cfg = SiteConfig.model_validate(
            {
                "site": "dc1",
                "ups": [{"name": "ups-a", "driver": "apcupsd", "control": {"options": {"command": argv}}}],
                "nodes": [{"name": "n1", "feeds": ["ups-a"]}],
            }
        )
        return UpsOutputs(cfg, timeout_s=10).driver("ups-a")

    assert await driver([str(script)]).shutdown_return(30) == f"{script} ran: apcupsd: killpower armed"
    env = dict(line.split("=", 1) for line in seen.read_text().splitlines() if "=" in line)
    assert env["POWERGUARD_UPS"] == "ups-a" and "PG_TEST_SECRET" not in env
    with pytest.raises(CommandRejected, match=r"exited 3"):
        await driver([str(script)]).shutdown_return(5)
    with pytest.raises(CommandRejected, match=r"needs control.options.command"):
        UpsOutputs(
            SiteConfig.model_validate(
                {
                    "site": "dc1",
                    "ups": [{"name": "ups-a", "driver": "apcupsd", "control": {"options": {}}}],
                    "nodes": [{"name": "n1", "feeds": ["ups-a"]}],
                }
            ),
            timeout_s=10,
        ).driver("ups-a")
