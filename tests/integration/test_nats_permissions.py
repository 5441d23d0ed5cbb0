"""compose/nats.conf on a real nats-server: one user per service, and the server itself refuses
what a service must not publish (only the coordinator sends power commands, only power-control
power results, only ups-monitor power events; the observer publishes nothing)."""

from __future__ import annotations

from pathlib import Path

import pytest

from powerguard.bus import Bus, BusNames, EmbeddedNats, PublishError
from powerguard.schemas import (
    NodeState,
    NodeStateData,
    OnBattery,
    PowerCommandData,
    PowerData,
    ShutdownRequested,
)
from tests.integration.ups.nut_peer import free_port

pytestmark = pytest.mark.integration
CONF = Path(__file__).resolve().parents[2] / "compose" / "nats.conf"
USERS = {
    "ups-monitor": "UPS_MONITOR",
    "coordinator": "COORDINATOR",
    "power-control": "POWER_CONTROL",
    "ckpt-agent": "CKPT_AGENT",
    "observer": "OBSERVER",
}


@pytest.fixture
def secured(tmp_path, monkeypatch):
    for user, var in USERS.items():
        monkeypatch.setenv(f"NATS_PW_{var}", f"pw-{user}")
    server = EmbeddedNats(store_dir=tmp_path, extra_args=["-c", str(CONF), "-m", str(free_port())])
    server.start()
    yield server
    server.stop()


async def connect(server: EmbeddedNats, user: str, **kw) -> Bus:
    return await Bus.connect(server.url, service=user, names=BusNames(), user=user, password=f"pw-{user}", **kw)


def on_battery() -> OnBattery:
    return OnBattery(data=PowerData(site="dc1", ups="ups-a", on_battery=True, runtime_s=300))


def shutdown() -> ShutdownRequested:
    return ShutdownRequested(data=PowerCommandData(saga_id="s1", node="n1", idempotency_key="s1/n1/shutdown"))


async def test_each_service_may_publish_only_its_own_subjects(secured):
    coordinator = await connect(secured, "coordinator")  # sets up the stream and the KV buckets
    monitor = await connect(secured, "ups-monitor", setup=False)
    control = await connect(secured, "power-control", setup=False)
    observer = await connect(secured, "observer", setup=False)
    try:
        await monitor.publish(on_battery(), timeout=3)  # its own: stored
        await coordinator.publish(shutdown(), timeout=3)
        await control.publish(NodeState(data=NodeStateData(node="n1", state="off")), timeout=3)
        for bus, event in (
            (monitor, shutdown()),  # ups-monitor sending a power command: refused by the server
            (control, shutdown()),
            (coordinator, on_battery()),  # nor may the coordinator fake a power event
            (monitor, NodeState(data=NodeStateData(node="n1", state="off"))),
            (observer, on_battery()),
        ):
            with pytest.raises(PublishError):
                await bus.publish(event, timeout=1)
        info = await coordinator.js.stream_info(coordinator.names.stream)
        assert info.state.messages == 3  # only the three allowed events were stored
    finally:
        for bus in (observer, control, monitor, coordinator):
            await bus.close()


async def test_observer_reads_events(secured):
    coordinator = await connect(secured, "coordinator")
    observer = await connect(secured, "observer", setup=False)
    try:
        await coordinator.publish(shutdown(), timeout=3)
        sub = observer.subscribe(ShutdownRequested, deliver="all")
        event = await sub.__anext__()
        assert event.data.node == "n1"
        await sub.aclose()
    finally:
        await observer.close()
        await coordinator.close()


async def test_wrong_password_is_refused(secured):
    from powerguard.bus import ConnectError

    with pytest.raises(ConnectError):
        await Bus.connect(secured.url, service="x", user="coordinator", password="nope", connect_timeout=2)
