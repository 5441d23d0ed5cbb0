"""Threat: the operator's credential (`powerguard drill`) leads to a real power action. A drill
was a field its publisher set (``drill: true``): left false, the operator's power events made
the coordinator send real shutdown commands. Now a drill's power events have their own subject,
which only the operator may publish and the coordinator treats as a drill, and the ``drill``
field is bound to that subject: a real reading can come only from ups-monitor."""

from __future__ import annotations

from powerguard.schemas import OnBattery, PowerData, PowerStatus, ShutdownRequested, encode

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


async def test_14_a_real_outage_during_a_drill_makes_it_real(deployment):
    dep = deployment
    operator = await dep.connect("operator")
    ups = await dep.connect("ups-monitor")
    async with coordinator(dep) as c:
        await operator.publish(OnBattery(data=reading(True, 300, drill=True)))
        await eventually(lambda: c.open and next(iter(c.open.values())).drill, 15, "a drill saga")
        await outage(ups)  # ups-monitor: the UPS really is on battery
        await eventually(lambda: not next(iter(c.open.values())).drill, 15, "the drill made real")
