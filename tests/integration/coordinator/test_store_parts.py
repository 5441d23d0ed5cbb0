"""The saga store's parts on a real nats-server: compressed, readable when an older writer left
them as plain JSON, and a part that is neither makes that one record unreadable (logged with the
key), never the load of the others."""

from __future__ import annotations

import logging
import zlib

import pytest

from powerguard.coordinator import saga
from powerguard.coordinator.record import SagaRecord, UpsView
from powerguard.coordinator.record_parts import PartLimits
from powerguard.coordinator.store import SagaStore
from powerguard.coordinator.topology import AgentRegistry, Topology
from powerguard.schemas import AgentData

pytestmark = pytest.mark.integration

SMALL = PartLimits(inline_bytes=2048, container_bytes=512, part_bytes=1024)


def record(saga_id: str, ranks: int = 400) -> SagaRecord:
    nodes = [f"n{i:03d}" for i in range(ranks // 8)]
    reg = AgentRegistry()
    for r in range(ranks):
        reg.update(AgentData(job="big", rank=r, world_size=ranks, node=nodes[r // 8], step=10))
    topo = Topology(site="dc1", feeds={n: ("A",) for n in nodes})
    ups = {"A": UpsView(on_battery=True, runtime_s=600.0)}
    return saga.start(saga_id=saga_id, topo=topo, ups=ups, jobs=reg.jobs(), now=1000.0, hold_policy="continue")


async def test_parts_are_compressed_and_older_json_parts_still_read(make_bus):
    bus = await make_bus("coordinator")
    kv = await bus.sagas()
    store = SagaStore(kv, limits=SMALL)
    rec = record("s1", ranks=1600)
    await store.create(rec)
    keys = [k for k in await kv.keys() if k.startswith("sagapart.")]
    assert len(keys) >= 4
    assert store.last_write["bytes_written"] < store.last_write["parts_json_bytes"] / 2  # rank -> node maps
    first = (await kv.get(keys[0])).value
    assert first[:1] == b"\x78"  # zlib

    # an older coordinator wrote its parts as JSON: rewrite every part so
    for k in keys:
        entry = await kv.get(k)
        await kv.put(k, zlib.decompress(entry.value))
    ((back, _),) = await SagaStore(kv, limits=SMALL).load()
    assert back == rec


async def test_a_corrupt_part_skips_that_record_with_the_reason_and_loads_the_others(make_bus, caplog):
    bus = await make_bus("coordinator")
    kv = await bus.sagas()
    store = SagaStore(kv, limits=SMALL)
    bad, good = record("bad"), record("good")
    await store.create(bad)
    await store.create(good)
    victim = next(k for k in await kv.keys() if k.startswith("sagapart.bad."))
    await kv.put(victim, b"\x78not zlib at all")
    with caplog.at_level(logging.ERROR):
        loaded = await SagaStore(kv, limits=SMALL).load()
    assert [r.saga_id for r, _ in loaded] == ["good"]
    assert any("saga.bad" in m and "neither JSON nor zlib" in m for m in caplog.messages), caplog.messages
