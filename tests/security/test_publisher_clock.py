"""A ups-monitor whose clock is minutes off is still heard: an event's age and "in the future"
are judged by the time JetStream stored it (the server's clock), the publisher's own time kept
for ordering only. Before: +100 s had every power event dead-lettered ``StampedInTheFuture``
(the 90 s skew bound), -150 s had every one "ignored as stale" (``max_event_age_s`` 120): no saga,
no shutdown."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

from powerguard.schemas import OnBattery, OnLine, utcnow
from powerguard.ups_monitor import clock

from .conftest import eventually
from .services import Watch, coordinator, reading

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("offset_s", [100, -150])
async def test_an_outage_from_a_ups_monitor_whose_clock_is_off_is_handled_as_at_zero(deployment, offset_s):
    dep = deployment
    ups = await dep.connect("ups-monitor")
    watch = await Watch(await dep.connect("observer")).start()
    try:
        async with coordinator(dep) as c:
            skewed = utcnow() + timedelta(seconds=offset_s)
            await ups.publish(OnBattery(time=skewed, data=reading(True, 300)))
            await eventually(lambda: "checkpointing" in watch.states or "holding" in watch.states, 15, "a real saga")
            (rec,) = c.open.values()
            assert not rec.drill
            await ups.publish(OnLine(time=skewed + timedelta(seconds=1), data=reading(False, 300)))
            await eventually(lambda: "cancelled" in watch.states, 30, "power back: the saga ends")
    finally:
        watch.stop()


@pytest.mark.parametrize("offset_s", [100, -150, 0])
async def test_ups_monitor_measures_its_clock_against_the_servers(deployment, offset_s):
    """What the PowerGuardClockOffset alert reads: the server's stamp of a write against this
    host's clock (here made off by ``offset_s``), with the ups-monitor's own credential."""
    ups = await deployment.connect("ups-monitor")
    got = await clock.probe(ups, "dc1", clock=lambda: time.time() + offset_s)
    assert abs(got.seconds + offset_s) <= 1.0 + got.error_s, got
