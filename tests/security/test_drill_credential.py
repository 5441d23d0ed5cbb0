"""Threat: the operator's credential (`powerguard drill`) leads to a real power action. A drill
was a field its publisher set (``drill: true``): left false, the operator's power events made
the coordinator send real shutdown commands. Now a drill's power events have their own subject,
which only the operator may publish and the coordinator treats as a drill, and the ``drill``
field is bound to that subject: a real reading can come only from ups-monitor."""

from __future__ import annotations

from datetime import timedelta

from powerguard.schemas import OnBattery, OnLine, PowerData, PowerStatus, ShutdownRequested, encode, utcnow
from tests.waiting import processed

from .conftest import SITE, eventually, refused
from .services import Watch, collected, coordinator, outage, power_control


def reading(on_battery: bool, runtime_s: float, *, drill: bool) -> PowerData:
    return PowerData(site=SITE, ups="ups-a", on_battery=on_battery, runtime_s=runtime_s, charge_pct=80, drill=drill)


async def test_14_the_operator_credential_never_causes_a_real_power_action(deployment):
    dep = deployment
    operator = await dep.connect("operator")
    observer = await dep.connect("observer")
    watch = await Watch(observer).start()
    try:
        async with (
            collected(observer, ShutdownRequested, observer.subjects.power_cmd("*")) as commands,
            coordinator(dep) as c,
            power_control(dep),
        ):
            # a "real" reading from the operator: the server refuses it (only ups-monitor's subject)
            await refused(operator.publish(OnBattery(data=reading(True, 300, drill=False)), timeout=1))
            # ... and "drill: false" on the drill subject is dead-lettered: the field is bound to it
            forged = OnBattery(data=reading(True, 300, drill=False))
            await operator.js.publish(operator.subjects.drill_power(SITE, "ups-a"), encode(forged))
            await eventually(lambda: watch.dead, 15, "the forged reading dead-lettered")
            assert watch.dead[0].data.error_type == "SubjectMismatch" and not c.open
            # the legitimate drill: a dry-run saga, every power command dry-run
            await operator.publish(OnBattery(data=reading(True, 300, drill=True)))
            await eventually(lambda: "holding" in watch.states, 15, "the drill's saga holding")
            await operator.publish(PowerStatus(data=reading(True, 40, drill=True)))  # below the reserve
            await eventually(lambda: len(commands) == 2, 15, "the drill's shutdown commands")
            assert all(cmd.data.dry_run for cmd in commands), "a drill sent a real power command"
            assert next(iter(c.open.values())).drill
    finally:
        watch.stop()


async def test_14_a_real_outage_during_a_drill_gets_its_own_real_saga_and_ends_the_drill(deployment):
    dep = deployment
    operator = await dep.connect("operator")
    ups = await dep.connect("ups-monitor")
    async with coordinator(dep) as c:
        await operator.publish(OnBattery(data=reading(True, 300, drill=True)))
        await eventually(lambda: c.open and next(iter(c.open.values())).drill, 15, "a drill saga")
        await outage(ups)  # ups-monitor: the UPS really is on battery
        await eventually(lambda: [r.drill for r in c.open.values()] == [False], 15, "the real saga alone")


# ----------------------------------------------------------------------------- threat 17
async def test_17_a_drill_on_line_stamped_a_day_ahead_hides_no_real_outage(deployment):
    """Before: every later real reading of the UPS was "older than its newest": a real outage
    with 40 s of battery got no saga and no shutdown. (A publisher's stamp is judged for ordering
    only now, its age by the server's clock: the reading is taken, and hides nothing.)"""
    dep = deployment
    operator = await dep.connect("operator")
    ups = await dep.connect("ups-monitor")
    admin = await dep.connect("admin", service="admin-check")
    watch = await Watch(await dep.connect("observer")).start()
    try:
        async with coordinator(dep) as c:
            ahead = utcnow() + timedelta(days=1)
            sent = await operator.publish(OnLine(time=ahead, data=reading(False, 300, drill=True)))
            await processed(admin, f"coordinator-drill-{SITE}", sent.seq)  # the coordinator handled it
            await outage(ups, runtime_s=40)
            await eventually(lambda: "shutting_down" in watch.states, 15, "the real outage's shutdown")
            assert [r.drill for r in c.open.values()] == [False]
    finally:
        watch.stop()


async def test_17_a_drill_on_line_during_a_real_outage_cancels_nothing_real(deployment):
    """Before: the drill's on_line cancelled the real saga."""
    dep = deployment
    operator = await dep.connect("operator")
    ups = await dep.connect("ups-monitor")
    admin = await dep.connect("admin", service="admin-check")
    watch = await Watch(await dep.connect("observer")).start()
    try:
        async with coordinator(dep) as c:
            await outage(ups)
            await eventually(lambda: "holding" in watch.states, 15, "the real saga holding")
            await operator.publish(OnBattery(data=reading(True, 300, drill=True)))
            sent = await operator.publish(OnLine(data=reading(False, 300, drill=True)))
            await processed(admin, f"coordinator-drill-{SITE}", sent.seq)  # the coordinator handled both
            (rec,) = c.open.values()
            assert not rec.drill and rec.state.value == "holding" and "cancelled" not in watch.states
    finally:
        watch.stop()


async def test_17_a_drill_status_of_one_second_sends_no_real_shutdown(deployment):
    """Before: the real saga took the drill's 1 s of runtime for its own and shut down at once."""
    dep = deployment
    operator = await dep.connect("operator")
    ups = await dep.connect("ups-monitor")
    observer = await dep.connect("observer")
    admin = await dep.connect("admin", service="admin-check")
    watch = await Watch(observer).start()
    try:
        async with (
            collected(observer, ShutdownRequested, observer.subjects.power_cmd("*")) as commands,
            coordinator(dep) as c,
            power_control(dep),
        ):
            await outage(ups, runtime_s=600)
            await eventually(lambda: "holding" in watch.states, 15, "the real saga holding")
            sent = await operator.publish(PowerStatus(data=reading(True, 1, drill=True)))
            await processed(admin, f"coordinator-drill-{SITE}", sent.seq)
            await c.tick()  # a tick after it: the saga decided whatever it would
            assert not commands and next(iter(c.open.values())).state.value == "holding"
    finally:
        watch.stop()
