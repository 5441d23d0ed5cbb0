"""The coordinator as a real process: SIGKILL in every state, restart, the saga completes in the
same trace with no command executed twice; two replicas, exactly one acts."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from powerguard.bus.roles import durable_names
from powerguard.coordinator.store import SagaStore
from powerguard.sim.agents import SimulatedRanks
from powerguard.sim.executor import SimulatedPowerControl

from .helpers import JOBS, NODES, SagaWatch, drain_battery, eventually, outage, power_back, site_file
from .process import CoordinatorProcess

pytestmark = pytest.mark.integration


@pytest.fixture
async def world(make_bus, names, nats_server, tmp_path):
    path = site_file(tmp_path / "site.yaml", names)
    sim_bus, ctl_bus, obs_bus = await make_bus("sim"), await make_bus("power-control"), await make_bus("observer")
    ranks = SimulatedRanks(sim_bus, JOBS, step=80)
    await ranks.start()
    executor = SimulatedPowerControl(ctl_bus, resume_step={j: 80 for j in JOBS})
    await executor.start()
    watch = await SagaWatch(obs_bus).start()
    procs: list[CoordinatorProcess] = []

    async def spawn(instance: str = "c1") -> CoordinatorProcess:
        p = await CoordinatorProcess(path, nats_server.url, instance).start()
        procs.append(p)
        return p

    yield dict(
        path=path,
        url=nats_server.url,
        sim=sim_bus,
        obs=obs_bus,
        ranks=ranks,
        executor=executor,
        watch=watch,
        spawn=spawn,
    )
    for p in procs:
        await p.kill()
    await watch.stop()
    await executor.stop()
    await ranks.stop()


EXPECTED = sorted(
    [(n, "shutdown") for n in NODES]
    + [(n, "power_on") for n in NODES]
    + [(j, "stop") for j in JOBS]
    + [(j, "restart") for j in JOBS]
)


@pytest.mark.parametrize("kill_in", ["checkpointing", "holding", "shutting_down", "down", "restoring"])
async def test_sigkill_in_every_state_then_restart_completes_the_saga(world, kill_in):
    w = world
    ranks, executor, watch = w["ranks"], w["executor"], w["watch"]
    if kill_in == "checkpointing":
        ranks.ack_delay_s = 1.5
    if kill_in in ("shutting_down", "restoring"):
        executor.delay_s = 0.4
    proc = await w["spawn"]()
    await eventually(lambda: proc.said("leads site"), 20, "leadership")
    await outage(w["sim"])
    if kill_in == "checkpointing":
        await watch.reach("checkpointing")
    else:
        await watch.reach("holding")
        if kill_in != "holding":
            await drain_battery(w["sim"])
            await watch.reach("shutting_down" if kill_in == "shutting_down" else "down")
            if kill_in == "restoring":
                await power_back(w["sim"])
                await watch.reach("restoring")
    sagas = SagaStore(await w["obs"].sagas())
    ((before, _),) = await sagas.load()
    await proc.kill()
    proc = await w["spawn"]()  # same instance name: takes its lease back at once
    if kill_in in ("checkpointing", "holding"):
        await watch.reach("holding")
        await drain_battery(w["sim"])
    if kill_in in ("checkpointing", "holding", "shutting_down"):
        await watch.reach("down")
    if kill_in != "restoring":
        await power_back(w["sim"])
    await watch.reach("done", 30)
    assert await proc.stop() == 0
    ((after, _),) = await sagas.load()
    assert after.trace_id == before.trace_id and after.root_span_id == before.root_span_id
    assert sorted(executor.actions()) == EXPECTED  # every command executed exactly once
    assert len(executor.executed) == len(set(executor.executed))
    assert watch.states[-3:] == ["restoring", "resumed", "done"]
    assert len(watch.states) == len(set(watch.states))  # no transition published twice


async def test_two_replicas_exactly_one_acts_and_the_other_takes_over(world):
    w = world
    a = await w["spawn"]("replica-a")
    await eventually(lambda: a.said("leads site"), 20, "first leader")
    b = await w["spawn"]("replica-b")
    await eventually(lambda: b.said("ready for site"), 20, "standby up")
    await outage(w["sim"])
    await w["watch"].reach("holding")
    assert not b.said("leads site")
    out = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).parent / "powerguard"),
        "status",
        "--json",
        "--url",
        w["url"],
        "--config",
        str(w["path"]),
        stdout=asyncio.subprocess.PIPE,
    )
    stdout, _ = await out.communicate()
    (row,) = json.loads(stdout)
    assert (row["state"], row["acks"], row["nodes_at_risk"]) == ("holding", "8/8", NODES)
    await a.kill()
    await eventually(lambda: b.said("leads site"), 20, "takeover")
    await drain_battery(w["sim"])
    await w["watch"].reach("down", 30)  # a final checkpoint first: power back before it would cancel the stop
    await power_back(w["sim"])
    try:
        await w["watch"].reach("done", 30)
    except AssertionError:
        print("\n".join(str(x) for x in b.lines))
        raise
    assert sorted(w["executor"].actions()) == EXPECTED
    assert not a.said("resuming saga")  # a never restarted
    assert b.said("resuming saga")
    assert await b.stop() == 0


async def test_a_replica_that_cannot_start_leading_retries_instead_of_exiting(make_bus, names, nats_server, tmp_path):
    """Taking over, the standby could not bind its consumers (CI: a 3-node cluster answering 503
    for a while after a power cut of every server): the coordinator exited, and with no
    supervisor to start it again the saga stayed in ``restoring``. Now it reports not ready,
    retries, and leads once the broker answers. The stream is deleted here to make the bind fail
    until it is back: the same path as a cluster still electing its leaders."""
    path = site_file(tmp_path / "site.yaml", names)
    admin = await make_bus("test")
    a = await CoordinatorProcess(path, nats_server.url, "replica-a").start()
    b = CoordinatorProcess(path, nats_server.url, "replica-b")
    try:
        await eventually(lambda: a.said("consuming inputs"), 30, "the first leader consuming")
        await b.start()
        await eventually(lambda: b.said("standby"), 30, "the standby")
        await admin.js.delete_stream(names.stream)  # its durables go with it
        await a.kill()
        await eventually(lambda: b.said("could not start leading"), 30, "the takeover failing")
        assert b.proc.returncode is None, "\n".join(str(x) for x in b.lines[-20:])
        await admin.setup()  # the stream back (what the cluster's recovery amounts to for the bind)
        await eventually(lambda: b.said("consuming inputs"), 30, "the takeover, retried")
        power = durable_names("dc1")["coordinator-power"]
        assert (await admin.js.consumer_info(names.stream, power)).name == power
        assert b.proc.returncode is None
    finally:
        await a.kill()
        await b.kill()
