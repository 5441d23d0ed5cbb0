"""A 3-node NATS JetStream cluster on loopback (R3 stream and KV buckets) loses the node that
leads the event stream in the middle of a saga: the saga completes and no event is lost."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time

import pytest

from powerguard.bus import Bus, BusNames, EmbeddedNats
from powerguard.bus.names import StreamLimits
from powerguard.coordinator.service import Coordinator
from powerguard.schemas import Envelope
from powerguard.sim.agents import SimulatedRanks
from powerguard.sim.executor import SimulatedPowerControl
from tests.integration.ups.nut_peer import free_port

from .helpers import JOBS, SagaWatch, drain_battery, outage, policy, power_back, site

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


@pytest.fixture
def cluster(tmp_path):
    ports, routes = [free_port() for _ in range(3)], [free_port() for _ in range(3)]
    route_urls = ",".join(f"nats://127.0.0.1:{p}" for p in routes)
    nodes = [
        EmbeddedNats(
            port=ports[i],
            store_dir=tmp_path / f"n{i}",
            ready_timeout=20,
            extra_args=[
                "--server_name",
                f"n{i}",
                "--cluster_name",
                "pg",
                "--cluster",
                f"nats://127.0.0.1:{routes[i]}",
                "--routes",
                route_urls,
            ],
        )
        for i in range(3)
    ]
    for n in nodes:
        n.start()
    yield nodes
    for n in nodes:
        with contextlib.suppress(Exception):
            n.stop()


async def connect(nodes, service: str, names: BusNames) -> Bus:
    urls = [n.url for n in nodes]
    deadline = time.monotonic() + 30
    while True:  # the JetStream meta leader is elected a few seconds after the routes connect
        try:
            return await Bus.connect(urls, service=service, names=names, limits=StreamLimits(replicas=3))
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


async def test_saga_survives_the_loss_of_the_stream_leader(cluster):
    names = BusNames.isolated()
    bus = await connect(cluster, "coordinator", names)
    sim_bus, ctl_bus, obs_bus = [await connect(cluster, n, names) for n in ("sim", "pc", "observer")]
    info = await bus.js.stream_info(names.stream)
    assert info.config.num_replicas == 3
    seen: dict[str, Envelope] = {}

    async def observe() -> None:
        async for ev in obs_bus.subscribe(deliver="all", subject=obs_bus.subjects.all):
            seen[ev.id] = ev

    observer = asyncio.create_task(observe())
    ranks = SimulatedRanks(sim_bus, JOBS, step=120)
    await ranks.start()
    executor = SimulatedPowerControl(ctl_bus, resume_step={"j1": 120, "j2": 120})
    await executor.start()
    watch = await SagaWatch(bus).start()
    coordinator = Coordinator(bus, site(), policy=policy().model_copy(update={"lease_ttl_s": 5.0}), instance="c1")
    stop = asyncio.Event()
    task = asyncio.create_task(coordinator.run(stop))
    published: list[str] = []
    try:
        deadline = time.monotonic() + 20
        while not coordinator.leader:
            assert time.monotonic() < deadline, "coordinator never became leader"
            await asyncio.sleep(0.05)
        published.append((await outage(sim_bus)).id)
        await watch.reach("holding", timeout=60)
        leader = (await bus.js.stream_info(names.stream)).cluster.leader
        victim = next(n for n in cluster if f"n{cluster.index(n)}" == leader)
        victim.proc.send_signal(signal.SIGKILL)  # the stream leader's host dies mid-saga
        victim.proc.wait()
        await drain_battery(sim_bus, runtime_s=40)
        await watch.reach("down", timeout=90)
        await power_back(sim_bus)
        await watch.reach("done", timeout=90)
        new_leader = (await bus.js.stream_info(names.stream)).cluster.leader
        assert new_leader and new_leader != leader
        await asyncio.sleep(1.0)
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 15)
        observer.cancel()
        await executor.stop()
        await watch.stop()
        for b in (obs_bus, ctl_bus, sim_bus, bus):
            with contextlib.suppress(Exception):
                await b.close()
    assert watch.states[-3:] == ["restoring", "resumed", "done"]
    # nothing lost: the outage event, every ack and every command and result are in the stream
    assert published[0] in seen
    acks = [e for e in seen.values() if e.type.endswith("ckpt.v1.durable")]
    assert {(e.data.job, e.data.rank) for e in acks} == {(j, r) for j in JOBS for r in range(4)}
    kinds = {e.type.rsplit(".", 1)[-1] for e in seen.values()}
    assert {"shutdown_requested", "on_requested", "restart_requested"} <= kinds
    assert sorted(executor.executed) == sorted(set(executor.executed))  # every command executed once
