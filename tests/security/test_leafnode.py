"""Ranks behind a node's leaf nats-server (docs/architecture.md, "Ranks on the bus at scale"): the
shipped compose/nats-leafnodes.conf on the site server and compose/nats-leaf.conf on the node,
TLS on the leaf connection, the leaf authenticated with one job's credential for this node. The ranks register,
receive their job's request and ack it through the leaf, as with their own connections; whatever
a rank on that node sends that the job's credential does not allow (a power command, another
job's ack, a forged power event) is dropped by the site server, and another job's requests never
reach the leaf."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
from datetime import UTC, datetime, timedelta

import pytest

from powerguard.bus import Bus
from powerguard.bus.agents import announce
from powerguard.bus.embedded import find_nats_server
from powerguard.bus.names import JS_DOMAIN
from powerguard.bus.roles import inbox
from powerguard.schemas import (
    AgentData,
    AgentRegistered,
    CheckpointDurable,
    CheckpointDurableData,
    CheckpointRequestData,
    CheckpointRequested,
    OnBattery,
    PowerCommandData,
    ShutdownRequested,
    decode,
    encode,
)
from tests.integration.ups.nut_peer import free_port

from .conftest import SITE, eventually, make_certs, refused, start
from .services import reading

# the node the leaf runs on: its credential is this node's only (`creds issue agent --job jobA
# --node <node>`), and the ckpt-agent names its node by the host name
NODE = socket.gethostname().split(".")[0]

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def request(job: str, rid: str) -> CheckpointRequested:
    deadline = datetime.now(UTC) + timedelta(minutes=5)
    return CheckpointRequested(data=CheckpointRequestData(request_id=rid, saga_id="s1", job=job, deadline=deadline))


def durable(job: str, rank: int, rid: str) -> CheckpointDurable:
    data = CheckpointDurableData(
        job=job, rank=rank, request_id=rid, saga_id="s1", step=7, path="/c", bytes=1, digest="00"
    )
    return CheckpointDurable(data=data)


def start_leaf(tmp_path, env: dict) -> subprocess.Popen:
    """The node's leaf nats-server, with the shipped compose/nats-leaf.conf."""
    with open(tmp_path / "leaf.log", "wb") as log:
        return subprocess.Popen([find_nats_server(), "-c", str(tmp_path / "nats-leaf.conf")], env=env, stderr=log)


@pytest.fixture
async def site_with_leaf(tmp_path, monkeypatch):
    certs = make_certs(tmp_path / "certs")
    monkeypatch.setenv("NATS_LEAFNODE_PORT", str(hub_leaf_port := free_port()))
    dep = start(tmp_path, conf="nats-leafnodes.conf", tls=certs, monkeypatch=monkeypatch)
    leaf_port = free_port()
    env = {
        **os.environ,
        "NATS_LEAF_PORT": str(leaf_port),
        "NATS_LEAF_USER": "rank",
        "NATS_LEAF_PASSWORD": "node-local-secret",
        "NATS_LEAF_HUB": f"tls://localhost:{hub_leaf_port}",
        "NATS_LEAF_CREDS": str(dep.creds_of("agent", "jobA", NODE)),  # this node's only
        "NATS_CA": str(certs / "ca.pem"),
    }
    leaf = start_leaf(tmp_path, env)
    try:
        admin = await dep.connect("admin")
        await admin.bootstrap([SITE])
        yield dep, f"nats://127.0.0.1:{leaf_port}", tmp_path / "leaf.log"
    finally:
        leaf.terminate()
        leaf.wait(10)
        await dep.close()


def into(out: list, transform=lambda m: m):
    async def cb(msg) -> None:
        out.append(transform(msg))

    return cb


async def rank_bus(dep, url: str, rank: int) -> Bus:
    """A rank of jobA on the node, as the ckpt-agent connects: the leaf's local user, the job's inbox."""
    last: Exception | None = None
    for _ in range(50):  # the leaf may still be connecting to the site server
        try:
            bus = await Bus.connect(
                url,
                service=f"ckpt-agent-jobA-{rank}",
                names=dep.names,
                user="rank",
                password="node-local-secret",
                inbox_prefix=inbox("agent", "jobA"),
                js_domain=JS_DOMAIN,
                setup=False,
                connect_timeout=2,
            )
            dep.buses.append(bus)
            await bus.agents()  # JetStream through the leaf answers (the KV bucket's stream info)
            return bus
        except Exception as exc:
            last = exc
            await asyncio.sleep(0.2)
    raise AssertionError(f"no rank could use the bus through the leaf: {last!r}")


async def test_ranks_behind_a_leaf_work_as_their_job_and_nothing_more(site_with_leaf):
    dep, leaf_url, _ = site_with_leaf
    coordinator = await dep.connect("coordinator")
    observer = await dep.connect("observer")
    seen: list[tuple[str, object]] = []  # what the site server stored: (subject, event)
    stored = await observer.subscribe(deliver="new").start()

    async def follow() -> None:
        while True:
            r = await stored.next_received()
            seen.append((r.subject, r.event))

    following = asyncio.create_task(follow())

    ranks = [await rank_bus(dep, leaf_url, r) for r in (0, 1)]
    got: dict[int, list] = {0: [], 1: []}
    for r, bus in enumerate(ranks):
        for job in ("jobA", "jobB"):
            await bus.nc.subscribe(bus.subjects.ckpt_request(job), cb=into(got[r], lambda m: decode(m.data)))
        await announce(bus, AgentRegistered(data=AgentData(job="jobA", rank=r, world_size=2, node=NODE)))
    agents = await coordinator.agents()
    await eventually(lambda: len(seen) >= 2, 10, "both registrations on the site server")
    assert sorted(k for k in await agents.keys()) == [f"jobA.{NODE}.0", f"jobA.{NODE}.1"]
    # a rank here cannot register on another node: the leaf's credential is for this one only
    moved = AgentRegistered(data=AgentData(job="jobA", rank=1, world_size=2, node="gpu999"))
    await refused(announce(ranks[1], moved))
    assert sorted(k for k in await agents.keys()) == [f"jobA.{NODE}.0", f"jobA.{NODE}.1"]

    # another job's request never reaches the leaf; the job's own does, and both ranks ack it
    await coordinator.publish(request("jobB", "rb"))
    await coordinator.publish(request("jobA", "ra"))
    # published after jobB's on the same connection, and the leaf forwards in order: had jobB's
    # reached the ranks, it would be there already
    await eventually(lambda: all(got.values()), 10, "jobA's request at both ranks")
    assert [[e.data.request_id for e in evs] for evs in got.values()] == [["ra"], ["ra"]]

    # a rank tries what its job may not: a shutdown command, another job's ack, a power event;
    # then acks for real. The leaf forwards in order, so the ack arriving and the rest not means dropped
    hostile = ranks[1]
    cmd = ShutdownRequested(data=PowerCommandData(saga_id="s1", node="gpu001", idempotency_key="x"))
    await hostile.nc.publish(hostile.subjects.power_cmd("gpu001"), encode(cmd))
    await hostile.nc.publish(hostile.subjects.ckpt_ack("jobB", 0), encode(durable("jobB", 0, "rb")))
    await hostile.nc.publish(cmd.nats_subject(hostile.subjects), encode(cmd))
    power = OnBattery(data=reading(True, 10))
    await hostile.nc.publish(power.nats_subject(hostile.subjects), encode(power))
    for r, bus in enumerate(ranks):
        await bus.js.publish(bus.subjects.ckpt_ack("jobA", r), encode(durable("jobA", r, "ra")))
    await eventually(lambda: sum(s.endswith(".ack") for s, _ in seen) >= 2, 10, "both acks at the site server")
    subjects = [s for s, _ in seen]
    assert sorted(s for s in subjects if ".ack" in s) == [dep.names.subjects.ckpt_ack("jobA", r) for r in (0, 1)]
    assert not [s for s in subjects if ".cmd." in s or ".power." in s], subjects
    following.cancel()


async def test_a_training_job_behind_the_leaf_registers_checkpoints_one_step_and_acks(site_with_leaf, tmp_path):
    """The ckpt-agent itself (a 2-rank torchrun job) with only the leaf's local user: NATS_URL on
    the node, NATS_JS_DOMAIN; no credential of its own."""
    from tests.integration.ckpt.runner import Trainer
    from tests.integration.ckpt.test_agent import answers, registered, request

    dep, leaf_url, _ = site_with_leaf
    coordinator = await dep.connect("coordinator")
    observer = await dep.connect("observer")
    acks = observer.subscribe(CheckpointDurable, deliver="all")
    await acks.start()
    env = {"NATS_USER": "rank", "NATS_PASSWORD": "node-local-secret", "NATS_JS_DOMAIN": JS_DOMAIN, "NATS_CREDS": ""}
    job = Trainer(tmp_path / "job", "jobA", nats_url=leaf_url, names=dep.names, env=env, steps=100_000, step_sleep=0.02)
    await job.start()
    try:
        await registered(observer, "jobA")
        assert sorted(await (await coordinator.agents()).keys()) == [f"jobA.{NODE}.0", f"jobA.{NODE}.1"]
        await request(coordinator, "jobA", rid="leaf-1")
        got = await answers(acks, 2)
    finally:
        await job.kill()
        await acks.aclose()
    assert {a.data.rank for a in got} == {0, 1} and {a.data.request_id for a in got} == {"leaf-1"}
    assert len({a.data.step for a in got}) == 1  # one step for every rank, as without the leaf
