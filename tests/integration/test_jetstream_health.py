"""The JetStream health exporter against a real nats-server: a durable that nobody reads shows
its pending messages and a stuck ack floor, dead letters are counted per service (0 before the
first), a missing durable is reported, and the stream's replicas and leader are read."""

from __future__ import annotations

import pytest

from powerguard.bus import Bus
from powerguard.bus.health import collect
from powerguard.schemas import OnBattery, PowerData

pytestmark = pytest.mark.integration


async def test_collect_reports_lag_dead_letters_and_missing_durables(nats_server, names):
    bus = await Bus.connect(nats_server.url, service="coordinator", names=names)
    try:
        snap = await collect(bus, "dc1")
        assert snap.consumers["coordinator-power-dc1"] == {"present": 0}  # not bootstrapped yet
        assert snap.dead_letters == {"ups-monitor": 0, "coordinator": 0, "power-control": 0}
        await bus.bootstrap(["dc1"])
        for _ in range(3):  # power events the coordinator's durable holds, nobody reading them
            await bus.publish(OnBattery(data=PowerData(site="dc1", ups="ups-a", on_battery=True)))
        await bus.dead_letter(subject=bus.subjects.power("dc1", "ups-a"), payload=b"{bad", error="not JSON")
        snap = await collect(bus, "dc1", now=10**10)
        lag = snap.consumers["coordinator-power-dc1"]
        assert lag["present"] == 1 and lag["pending"] == 3 and lag["ack_pending"] == 0
        assert lag["ack_floor_age_s"] > 1e9  # the floor never moved (judged at a far-off "now")
        assert lag["lag_s"] > 1e9  # the oldest waiting message's age, by its own stamp
        assert snap.consumers["coordinator-dc1"]["pending"] == 0  # power events are not the results' input
        assert snap.consumers["power-control-dc1"]["pending"] == 0 and snap.consumers["power-control-dc1"]["lag_s"] == 0
        assert snap.dead_letters["coordinator"] == 1
        events = snap.streams[names.stream]
        assert events == {
            "messages": 4,
            "bytes": events["bytes"],
            "replicas": 1,
            "replicas_current": 1,
            "has_leader": 1,
        }
        assert snap.streams[names.jobs_stream]["messages"] == 0  # the jobs' own stream: nothing of theirs yet
        assert snap.kv[names.sagas] == 0
    finally:
        await bus.close()
