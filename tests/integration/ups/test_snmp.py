"""ups-monitor against a real net-snmp snmpd (pass_persist UPS) and a real nats-server."""

from __future__ import annotations

import asyncio

import pytest

from powerguard.schemas import POWER_EVENTS, SiteConfig
from powerguard.snmp import SnmpCredentials, auth_data
from powerguard.ups_monitor.snmp import SnmpAuthError, SnmpDriver

from .snmp_peer import V3_AUTH, V3_PRIV, V3_USER, SnmpUps
from .test_nut import monitoring, next_power_event

pytestmark = pytest.mark.integration


@pytest.fixture
def agent(tmp_path):
    ups = SnmpUps(tmp_path).start()
    yield ups
    ups.stop()


def site(port: int, **options) -> SiteConfig:
    return SiteConfig(
        site="dc1",
        ups=[{"name": "ups1", "driver": "snmp", "port": port, "options": options}],
        nodes=[{"name": "n1", "feeds": ["ups1"]}],
    )


@pytest.mark.parametrize("profile", ["ups-mib", "apc"])
async def test_v2c_outage_sequence(bus, agent, profile):
    async with bus.subscribe(*POWER_EVENTS, deliver="all") as sub:
        await sub.start()
        async with monitoring(bus, site(agent.port, profile=profile)):
            first = await asyncio.wait_for(sub.__anext__(), 15)
            assert not first.data.on_battery and first.data.runtime_s == 1800 and first.data.charge_pct == 100
            agent.set(on_battery=True, runtime_s=600, charge=80, seconds_on_battery=5)
            ev = await next_power_event(sub)
            assert ev.short_type == "power.v1.on_battery"
            assert (ev.data.runtime_s, ev.data.charge_pct, ev.data.input_v) == (600, 80, 0)
            agent.set(on_battery=True, low_battery=True, runtime_s=120, charge=15)
            ev = await next_power_event(sub)
            assert ev.short_type == "power.v1.low_battery" and ev.data.runtime_s == 120
            agent.set(on_battery=False)
            ev = await next_power_event(sub)
            assert ev.short_type == "power.v1.on_line" and ev.data.driver == "snmp"


async def test_v3_auth_priv(bus, agent, monkeypatch):
    monkeypatch.setenv("PG_T_AUTH", V3_AUTH)
    monkeypatch.setenv("PG_T_PRIV", V3_PRIV)
    cfg = site(agent.port, version="3", user=V3_USER, auth_key={"env": "PG_T_AUTH"}, priv_key={"env": "PG_T_PRIV"})
    kinds = []
    async with bus.subscribe(*POWER_EVENTS, deliver="all") as sub:
        await sub.start()
        async with monitoring(bus, cfg):
            agent.set(on_battery=True, runtime_s=300)
            ev = await next_power_event(sub)
            assert ev.data.runtime_s == 300
            kinds.append(ev.short_type)
            agent.set(on_battery=True, low_battery=True, runtime_s=60)
            kinds.append((await next_power_event(sub)).short_type)
            agent.set(on_battery=False)
            kinds.append((await next_power_event(sub)).short_type)
    assert kinds == ["power.v1.on_battery", "power.v1.low_battery", "power.v1.on_line"]


async def test_wrong_v3_credentials_give_a_clear_error_and_comm_lost(bus, agent, monkeypatch):
    monkeypatch.setenv("PG_T_AUTH", "wrong-key-1")
    monkeypatch.setenv("PG_T_PRIV", V3_PRIV)
    creds = SnmpCredentials(version="3", user=V3_USER, auth_key={"env": "PG_T_AUTH"}, priv_key={"env": "PG_T_PRIV"})
    driver = SnmpDriver(name="ups1", host="127.0.0.1", port=agent.port, timeout=1.0, auth=auth_data(creds))
    with pytest.raises(SnmpAuthError, match="ups ups1: SNMP authentication failed"):
        await driver.poll()
    monkeypatch.setenv("PG_T_AUTH", "wrong-key-1")
    monkeypatch.setenv("PG_T_PRIV", V3_PRIV)
    cfg = site(agent.port, version="3", user=V3_USER, auth_key={"env": "PG_T_AUTH"}, priv_key={"env": "PG_T_PRIV"})
    async with bus.subscribe(*POWER_EVENTS, deliver="all") as sub:
        await sub.start()
        agent.set(on_battery=True)  # the monitor must not guess
        async with monitoring(bus, cfg):
            ev = await next_power_event(sub)
    assert ev.short_type == "power.v1.comm_lost" and "authentication failed" in ev.data.reason


async def test_agent_down_then_back_gives_comm_lost_then_comm_restored(bus, agent):
    async with bus.subscribe(*POWER_EVENTS, deliver="all") as sub:
        await sub.start()
        async with monitoring(bus, site(agent.port, profile="ups-mib")):
            await asyncio.wait_for(sub.__anext__(), 15)  # first status
            agent.stop()
            ev = await next_power_event(sub)
            assert ev.short_type == "power.v1.comm_lost" and not ev.data.on_battery
            agent.start()
            ev = await next_power_event(sub)
            assert ev.short_type == "power.v1.comm_restored"


async def test_missing_and_wrongly_typed_values_make_a_partial_reading(agent):
    agent.set(
        on_battery=True,
        missing=[".1.3.6.1.2.1.33.1.2.4.0"],
        override={".1.3.6.1.2.1.33.1.4.4.1.5.1": ("string", "forty")},
    )
    driver = SnmpDriver(
        name="ups1",
        host="127.0.0.1",
        port=agent.port,
        profile="ups-mib",
        auth=auth_data(SnmpCredentials(), default_community="public"),
    )
    reading = await driver.poll()
    assert reading.on_battery and reading.partial
    assert reading.charge_pct is None and reading.load_pct is None
    assert any("charge" in e for e in reading.errors) and any("load" in e for e in reading.errors)


async def test_unknown_v3_user_recovers_once_the_agent_knows_it(bus, tmp_path, monkeypatch):
    """Wrong credentials: comm_lost, the monitor keeps running, and it recovers without a restart
    once the agent is fixed (here: snmpd restarted with the user created)."""
    from .test_nut import SETTINGS

    monkeypatch.setenv("PG_T_AUTH", V3_AUTH)
    monkeypatch.setenv("PG_T_PRIV", V3_PRIV)
    before = SnmpUps(tmp_path).start()
    cfg = site(
        before.port,
        version="3",
        user="latecomer",
        auth_key={"env": "PG_T_AUTH"},
        priv_key={"env": "PG_T_PRIV"},
        profile="ups-mib",
    )
    settings = SETTINGS.model_copy(update={"timeout_s": 3.0})  # a new engine's first exchange is slow
    try:
        async with bus.subscribe(*POWER_EVENTS, deliver="all") as sub:
            await sub.start()
            async with monitoring(bus, cfg, settings=settings):
                ev = await next_power_event(sub)
                assert ev.short_type == "power.v1.comm_lost" and "authentication failed" in ev.data.reason
                before.stop()
                after = SnmpUps(tmp_path, extra_users=("latecomer",), port=before.port).start()
                try:
                    ev = await next_power_event(sub, timeout=30)
                    assert ev.short_type == "power.v1.comm_restored"
                finally:
                    after.stop()
    finally:
        before.stop()
