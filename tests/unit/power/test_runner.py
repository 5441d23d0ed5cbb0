"""The runner (``sequences.Sequencer``) executes the plan it is given, in virtual time with
fake devices: the shutdown's steps in the plan's order, each cut at the plan's deadline; the
restore's power-ons in the ramp slots the plan gave (booked, never reserved a second time),
group after group, each node cut at its bound. A device that breaks a deadline is reported
failed at that deadline, not later."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from powerguard.power_control import clock
from powerguard.power_control.config import PowerControlSettings
from powerguard.power_control.drivers.base import PowerDriver, PowerState
from powerguard.power_control.plans import call_s, restore_plan, shutdown_plan
from powerguard.power_control.ramp import Ramp
from powerguard.power_control.schedulers.base import Scheduler
from powerguard.power_control.sequences import Order, Sequencer
from powerguard.schemas import NodeConfig, NodeState, PowerActionDone, PowerActionFailed

from .virtual_time import run

HANG_S = 1e6  # a device that never answers (its driver's own timeout broken)


class FakeBmc(PowerDriver):
    """A BMC in virtual time: power-on takes ``boot_s`` to show "on"; ``ignore_acpi`` leaves a
    soft-off unanswered; calls named in ``hang`` never return."""

    kind = "fake"

    def __init__(self, node: str, *, state: PowerState = "on", boot_s: float = 5.0, ignore_acpi=False, hang=()):
        super().__init__(f"bmc:{node}", guard=None)  # type: ignore[arg-type]
        self.state, self.boot_s, self.ignore_acpi, self.hang = state, boot_s, ignore_acpi, set(hang)
        self.calls: list[tuple[str, float]] = []  # (call, when)

    async def _call(self, what: str) -> None:
        self.calls.append((what, clock.now()))
        if what in self.hang:
            await asyncio.sleep(HANG_S)

    async def status(self) -> PowerState:
        await self._call("status")
        return self.state

    async def on(self) -> None:
        await self._call("on")

        async def boot() -> None:
            await asyncio.sleep(self.boot_s)
            self.state = "on"

        asyncio.get_running_loop().create_task(boot())

    async def soft_off(self) -> None:
        await self._call("soft_off")
        if not self.ignore_acpi:
            self.state = "off"

    async def off(self) -> None:
        await self._call("off")
        self.state = "off"

    async def cycle(self) -> None:
        await self._call("cycle")

    async def restore_policy(self):
        return None

    async def set_restore_policy(self, policy) -> None:
        return None


class FakeDevices:
    dry_run = False

    def __init__(self, nodes: dict[str, NodeConfig], bmcs: dict[str, FakeBmc]) -> None:
        self.nodes, self.bmcs = nodes, bmcs

    def node(self, name: str) -> NodeConfig:
        return self.nodes[name]

    def bmc(self, name: str) -> FakeBmc | None:
        return self.bmcs.get(name)

    def pdu(self, name: str):
        raise AssertionError("no PDU in these tests")


class FakeScheduler(Scheduler):
    kind = "fake"
    one_stop_s = 30.0

    def __init__(self, stop_s: float = 0.0) -> None:
        self.stop_s = stop_s

    async def stop_job(self, job: str, *, nodes: Sequence[str], saga_id: str) -> str:
        await asyncio.sleep(self.stop_s)
        return f"stopped {job}"

    async def start_job(self, job: str, *, nodes: Sequence[str], saga_id: str) -> str:
        return f"started {job}"


def settings(**kw) -> PowerControlSettings:
    base = {"device_timeout_s": 5.0, "retries": 0, "soft_off_timeout_s": 60.0, "poll_interval_s": 1.0}
    return PowerControlSettings.model_validate({**base, **kw})


def runner(bmcs: dict[str, FakeBmc], s: PowerControlSettings, *, groups=None, scheduler=None):
    nodes = {n: NodeConfig(name=n, feeds=["ups-a"], power_on_group=(groups or {}).get(n, 0)) for n in bmcs}
    events: list = []

    async def emit(ev) -> None:
        events.append((clock.now(), ev))

    return Sequencer(FakeDevices(nodes, bmcs), scheduler or FakeScheduler(), s, emit), events, nodes


def of(events, kind) -> list:
    return [(t, e) for t, e in events if isinstance(e, kind)]


def test_a_shutdown_runs_the_plans_steps_at_the_plans_times():
    """Soft-off unanswered: the hard off comes at the plan's soft-off wait, not before or after."""
    bmc = FakeBmc("n1", ignore_acpi=True)
    s = settings()
    seq, events, nodes = runner({"n1": bmc}, s)

    async def go():
        t0 = clock.now()
        ok = await seq.shutdown(Order(saga_id="s1", node="n1", key="k", jobs=("j1",)))
        plan = shutdown_plan(
            nodes["n1"], s, now=t0, jobs=("j1",), retry=0, bmc="bmc:n1", scheduler="fake", scheduler_s=30.0
        )
        return ok, t0, plan

    ok, _, plan = run(go())
    assert ok and [c for c, _ in bmc.calls if c != "status"] == ["soft_off", "off"]
    soft = next(t for c, t in bmc.calls if c == "soft_off")
    hard = next(t for c, t in bmc.calls if c == "off")
    assert hard - soft == pytest.approx(s.soft_off_timeout_s, abs=0.01)  # the plan's wait_s
    assert all(t <= step.deadline for step, t in zip(plan.steps[1:], (soft, soft, hard), strict=False))
    ((_, off_state),) = [(t, e) for t, e in of(events, NodeState) if e.data.state == "off"]
    assert "off after" in off_state.data.detail
    assert not of(events, PowerActionFailed)


def test_a_bmc_that_never_answers_is_failed_at_the_plans_deadline_not_later():
    """The BMC's power-off hangs (its driver's timeout broken): the step ends at the plan's
    deadline, reported failed, and the node's shutdown ends failed then (not hours later)."""
    bmc = FakeBmc("n1", ignore_acpi=True, hang=("off",))
    s = settings()
    seq, events, nodes = runner({"n1": bmc}, s)

    async def go():
        t0 = clock.now()
        ok = await seq.shutdown(Order(saga_id="s1", node="n1", key="k"))
        return ok, t0, clock.now()

    ok, t0, ended = run(go())
    plan = shutdown_plan(nodes["n1"], s, now=t0, jobs=(), retry=0, bmc="bmc:n1", scheduler="fake", scheduler_s=30.0)
    off_step = next(x for x in plan.steps if x.action == "off")
    assert not ok
    ((t, failed),) = of(events, PowerActionFailed)
    assert failed.data.action == "off" and "not done by its planned deadline" in failed.data.error
    assert t == pytest.approx(off_step.deadline, abs=0.01) and ended == pytest.approx(off_step.deadline, abs=0.01)


def test_a_jobs_stop_past_its_bound_is_reported_and_the_power_still_goes_down():
    bmc = FakeBmc("n1")
    s = settings(job_stop_grace_s=0, job_stop_wait_s=0)
    seq, events, _ = runner({"n1": bmc}, s, scheduler=FakeScheduler(stop_s=HANG_S))

    async def go():
        t0 = clock.now()
        return await seq.shutdown(Order(saga_id="s1", node="n1", key="k", jobs=("j1",))), t0

    ok, t0 = run(go())
    ((t, failed),) = of(events, PowerActionFailed)
    assert ok and failed.data.action == "job_stop" and t == pytest.approx(t0 + 30.0, abs=0.01)  # one_stop_s
    assert bmc.state == "off"


def test_a_restore_powers_on_in_the_plans_ramp_slots_group_by_group():
    """60 nodes a minute: one power-on a second, as the plan booked them; group 1 starts when
    group 0 is on, re-planned from then (not at the plan's worst case)."""
    bmcs = {n: FakeBmc(n, state="off", boot_s=3.0) for n in ("a", "b", "c", "d")}
    s = settings(ramp={"nodes_per_min": 60}, max_parallel_power_on=4, boot_timeout_s=100)
    seq, events, nodes = runner(bmcs, s, groups={"d": 1})
    orders = [Order(saga_id="s1", node=n, key=f"k{n}") for n in bmcs]

    async def go():
        t0 = clock.now()
        plan = restore_plan(list(bmcs), nodes, s, now=t0, bmcs=set(bmcs), ramp=Ramp(s.ramp))
        return await seq.restore(orders), plan, t0

    result, plan, t0 = run(go())
    assert result == {n: True for n in bmcs}
    on = {n: next(t for c, t in b.calls if c == "on") for n, b in bmcs.items()}
    for n in ("a", "b", "c"):  # group 0 at the plan's slots
        assert on[n] == pytest.approx(plan.node(n).slot, abs=0.01), (n, on[n] - t0)
    assert [round(on[n] - t0, 2) for n in ("a", "b", "c")] == [0.0, 1.0, 2.0]
    # group 1: once group 0 was on (c on at +2 s, booted 3 s later), in the ramp's next slot
    assert on["d"] - t0 == pytest.approx(5.0, abs=0.1) and on["d"] < plan.node("d").slot
    ready = [e.data.node for _, e in of(events, NodeState) if e.data.state == "ready"]
    assert sorted(ready) == ["a", "b", "c", "d"]


def test_a_power_on_that_never_answers_is_failed_at_the_nodes_bound_and_the_others_come_up():
    bmcs = {"a": FakeBmc("a", state="off", hang=("on",)), "b": FakeBmc("b", state="off", boot_s=2.0)}
    s = settings(boot_timeout_s=20)
    seq, events, nodes = runner(bmcs, s)

    async def go():
        t0 = clock.now()
        plan = restore_plan(list(bmcs), nodes, s, now=t0, bmcs=set(bmcs))
        return await seq.restore([Order(saga_id="s1", node=n, key=f"k{n}") for n in bmcs]), plan, t0

    result, plan, t0 = run(go())
    assert result == {"a": False, "b": True}
    ((t, failed),) = of(events, PowerActionFailed)
    assert failed.data.node == "a" and "not done by its planned deadline" in failed.data.error
    assert t - t0 <= plan.node("a").bound_s + 0.1  # cut at its bound, not at the hang's end
    assert plan.node("a").bound_s == pytest.approx(call_s(s) + 20)


def test_a_soft_off_that_outlasts_its_window_is_followed_by_the_hard_off_not_a_failure():
    """The BMC takes the ACPI request but its answer never comes (hangs): at the step's planned
    deadline the runner moves on to the hard off, as for a node that ignored the request."""
    bmc = FakeBmc("n1", hang=("soft_off",))
    s = settings()
    seq, events, _ = runner({"n1": bmc}, s)

    async def go():
        return await seq.shutdown(Order(saga_id="s1", node="n1", key="k"))

    assert run(go())
    assert [c for c, _ in bmc.calls if c != "status"] == ["soft_off", "off"] and bmc.state == "off"
    (_, done), *_ = [(t, e) for t, e in of(events, PowerActionDone) if e.data.detail.startswith("hard off")]
    assert "soft-off failed" in done.data.detail and "planned deadline" in done.data.detail
    assert not of(events, PowerActionFailed)
