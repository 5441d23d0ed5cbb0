"""A full saga against a real nats-server: 2 jobs x 4 simulated ranks, simulated power-control."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from powerguard.coordinator.service import Coordinator
from powerguard.coordinator.store import SagaStore
from powerguard.sim.agents import SimulatedRanks
from powerguard.sim.executor import SimulatedPowerControl

from .helpers import JOBS, NODES, SagaWatch, drain_battery, eventually, outage, policy, power_back, site

pytestmark = pytest.mark.integration


@contextlib.asynccontextmanager
async def running(coordinator: Coordinator):
    stop = asyncio.Event()
    task = asyncio.create_task(coordinator.run(stop))
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


async def test_full_saga_with_two_jobs_of_four_ranks(make_bus, spans):
    bus, sim_bus, ctl_bus = await make_bus("coordinator"), await make_bus("sim"), await make_bus("power-control")
    ranks = SimulatedRanks(sim_bus, JOBS, step=120)
    await ranks.start()
    executor = SimulatedPowerControl(ctl_bus, resume_step={"j1": 120, "j2": 120})
    await executor.start()
    watch = await SagaWatch(bus).start()
    coordinator = Coordinator(bus, site(), policy=policy(), instance="c1")
    async with running(coordinator):
        await eventually(lambda: coordinator.leader, 10, "the coordinator to lead")
        first = await outage(sim_bus)
        await watch.reach("holding")
        assert {(j, r) for j, r in ranks.requests_seen} == {(j, r) for j in JOBS for r in range(4)}
        assert executor.executed == []  # nothing goes down while power may come back
        await drain_battery(sim_bus, runtime_s=40)
        await watch.reach("down")
        await power_back(sim_bus)
        await watch.reach("done")
    assert watch.states == [
        "detected",
        "checkpointing",
        "checkpointed",
        "holding",
        "final_checkpoint",  # 40 s left, below the reserve: 2 x its checkpoint fits in 10 % of it
        "shutting_down",
        "down",
        "restoring",
        "resumed",
        "done",
    ]
    actions = sorted(executor.actions())
    assert actions == sorted(
        [(n, "shutdown") for n in NODES]
        + [(n, "power_on") for n in NODES]
        + [(j, "stop") for j in JOBS]
        + [(j, "restart") for j in JOBS]
    )
    ((rec, _),) = await SagaStore(await bus.sagas()).load()
    assert rec.state.value == "done" and rec.acks() == (8, 8)
    # one trace: the ups-monitor's on_battery publish span is the parent of the outage
    publish = next(
        s
        for s in spans.get_finished_spans()
        if s.name.startswith("publish") and s.attributes.get("messaging.message.id") == first.id
    )
    trace_id = publish.context.trace_id
    assert rec.trace_id == f"{trace_id:032x}"
    names = {s.name for s in spans.get_finished_spans() if s.context.trace_id == trace_id}
    assert {"outage dc1", "checkpoint j1", "checkpoint j2", "hold", "shutdown n1", "power_on n4", "restart j2"} <= names
    root = next(s for s in spans.get_finished_spans() if s.name == "outage dc1")
    assert root.parent.span_id == publish.context.span_id
    assert root.attributes["powerguard.rpo_steps"] == 0
    # power-control's process spans for the commands are in the outage trace too
    assert any(
        s.name.startswith("process")
        and s.context.trace_id == trace_id
        and "cmd.power" in s.attributes["messaging.destination.name"]
        for s in spans.get_finished_spans()
    )
    await watch.stop()


async def test_flap_cancels_and_nothing_goes_down(make_bus):
    bus, sim_bus, ctl_bus = await make_bus("coordinator"), await make_bus("sim"), await make_bus("power-control")
    ranks = SimulatedRanks(sim_bus, JOBS)
    await ranks.start()
    executor = SimulatedPowerControl(ctl_bus)
    await executor.start()
    watch = await SagaWatch(bus).start()
    coordinator = Coordinator(bus, site(), policy=policy(), instance="c1")
    async with running(coordinator):
        await eventually(lambda: coordinator.leader, 10, "the coordinator to lead")
        await outage(sim_bus)
        await watch.reach("holding")
        await power_back(sim_bus)
        await watch.reach("cancelled")
    assert executor.executed == []
    await watch.stop()


async def test_silent_rank_makes_the_saga_partial_and_bad_input_changes_nothing(make_bus):
    from powerguard.schemas import CheckpointDurable, CheckpointDurableData, OnBattery, PowerData

    bus, sim_bus = await make_bus("coordinator"), await make_bus("sim")
    ranks = SimulatedRanks(sim_bus, JOBS, silent={("j1", 3)})
    await ranks.start()
    watch = await SagaWatch(bus).start()
    pol = policy().model_copy(update={"ckpt_timeout_s": 1.0})
    coordinator = Coordinator(bus, site(), policy=pol, instance="c1")
    async with running(coordinator):
        await eventually(lambda: coordinator.leader, 10, "the coordinator to lead")
        # bad input first: unknown UPS, malformed payload, ack for an unknown saga
        await sim_bus.publish(OnBattery(data=PowerData(site="dc1", ups="ups-zz", on_battery=True)))
        await sim_bus.nc.publish(sim_bus.subjects.power("dc1", "ups-a"), b"{garbage")
        await sim_bus.publish(
            CheckpointDurable(
                data=CheckpointDurableData(saga_id="nope", job="j1", rank=3, step=1, path="/x", bytes=1, digest="0")
            )
        )
        await outage(sim_bus)
        await watch.reach("holding")
    partial = next(e for e in watch.events if e.data.state.value == "partial")
    assert partial.data.missing_ranks == {"j1": [3]}
    ((rec, _),) = await SagaStore(await bus.sagas()).load()
    assert rec.jobs["j1"].missing == [3] and rec.jobs["j2"].missing == []
    assert "ups-zz" not in rec.ups
    await watch.stop()
