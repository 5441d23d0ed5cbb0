"""A large saga record splits into bounded parts and joins back to the same record."""

from __future__ import annotations

import json
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from powerguard.coordinator.inputs import Ack
from powerguard.coordinator.record import SagaRecord, UpsView
from powerguard.coordinator.record_parts import LIT, REF, MissingPart, PartLimits, SplitMemo, join, references, split
from powerguard.coordinator.store_format import RecordEncoder, decode, encode, ranks_as_runs
from powerguard.coordinator.topology import AgentRegistry, Topology
from powerguard.schemas import AgentData

from .harness import POLICY, Drive

SMALL = PartLimits(inline_bytes=64, container_bytes=32, part_bytes=128)
KEYS = st.text(max_size=8) | st.sampled_from([REF, "$type", LIT])  # keys the format itself uses, too
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=12) | st.dictionaries(KEYS, inner, max_size=12),
    max_leaves=60,
)


def named(name: str, content: bytes) -> str:
    return f"k{abs(hash((name, content)))}"


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(KEYS, json_values, max_size=8))
def test_join_of_split_is_the_record_and_no_part_exceeds_its_bound(data):
    head, parts = split(data, limits=SMALL, key_for=named)
    assert join(head, parts) == data
    for content in parts.values():
        items = json.loads(content)
        assert len(content) <= SMALL.part_bytes or len(items) == 1  # one item larger than a part stays whole
    if len(json.dumps(data, separators=(",", ":"))) <= SMALL.inline_bytes:
        # kept whole, byte for byte, unless a dict in it looks like a reference (then it is wrapped)
        assert parts == {} and (head == data or LIT in json.dumps(head))


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["acked", "levels", "xs"]), st.integers(0, 300), st.integers(0, 3)),
        min_size=1,
        max_size=60,
    )
)
def test_splits_that_reuse_their_memo_join_to_the_record_after_every_change(changes):
    data: dict = {"acked": {}, "levels": {str(i): "local" for i in range(100)}, "xs": list(range(80))}
    memo = SplitMemo()
    for field, key, value in changes:  # appends, overwrites and removals, as a saga makes them
        # as the store's encoder gives them: a changed container is a new object, the others the same
        data = dict(data)
        target = data[field] = type(data[field])(data[field])
        if isinstance(target, list):
            target.append(key) if value else target.pop(key % len(target)) if target else None
        elif value == 3:
            target.pop(str(key), None)
        else:
            target[str(key)] = value
        head, parts = split(data, limits=SMALL, key_for=named, memo=memo)
        assert join(head, parts) == data


def big_drive(ranks: int = 4096, per_node: int = 16) -> Drive:
    nodes = [f"node-{i:05d}" for i in range(ranks // per_node)]
    reg = AgentRegistry()
    for r in range(ranks):
        reg.update(AgentData(job="big", rank=r, world_size=ranks, node=nodes[r // per_node], step=100))
    return Drive(
        policy=POLICY, topo=Topology(site="dc1", feeds={n: ("A",) for n in nodes}), reg=reg, ups={"A": UpsView()}
    )


def test_a_4096_rank_saga_is_stored_in_parts_of_at_most_64_kib_and_an_ack_rewrites_one_part():
    d = big_drive()
    d.power("A", True)
    d.send([Ack(job="big", rank=r, request_id="s1/big/ckpt", step=101) for r in range(4000)])  # one batch
    limits = PartLimits()
    store: dict[str, bytes] = {}

    def keep(name: str, content: bytes) -> str:
        store.setdefault(name, content)
        return name if store[name] == content else name + "'"

    data = encode(d.rec)
    assert len(json.dumps(data)) > limits.inline_bytes  # ~140 KB as one value (~2 MB at 100k ranks)
    head, parts = split(data, limits=limits, key_for=keep)
    assert max(len(v) for v in parts.values()) <= limits.part_bytes
    assert len(json.dumps(head)) <= limits.inline_bytes
    assert head["state"] == d.state  # power-control reads the state from the head alone
    assert decode(join(head, parts)) == d.rec
    d.ack("big", 4000)
    _, again = split(encode(d.rec), limits=limits, key_for=keep)
    changed = set(again) - set(parts)
    assert 1 <= len(changed) <= 3, changed  # the last chunk of acked and levels (and the head's refs)


def test_a_missing_part_is_reported_not_guessed():
    data = {"xs": list(range(200))}
    head, parts = split(data, limits=SMALL, key_for=named)
    first = references(head)[0]
    del parts[first]
    try:
        join(head, parts)
    except MissingPart as exc:
        assert first in str(exc)
    else:
        raise AssertionError("a missing part went unnoticed")
    assert REF in json.dumps(head)


def test_a_node_plan_stores_only_what_happened_and_reads_back_the_same() -> None:
    from powerguard.coordinator.record import NodePlan

    rec = SagaRecord(saga_id="s", site="x", created_at=0.0, updated_at=0.0)
    rec.nodes = {
        "n1": NodePlan(node="n1"),
        "n2": NodePlan(node="n2", shutdown_at=1.5, off_at=2.0, error="bmc: timeout"),
    }
    stored = json.loads(json.dumps(encode(rec)))
    assert stored["nodes"]["n1"] == {"node": "n1"}
    assert stored["nodes"]["n2"] == {"node": "n2", "shutdown_at": 1.5, "off_at": 2.0, "error": "bmc: timeout"}
    assert decode(stored) == rec
    # every field set: the encoder takes a plan's fields as they are (JSON scalars), as a dump gives them
    sample = {"float": 3.5, "int": 2, "str": "x"}
    full = NodePlan(
        **{k: next(v for t, v in sample.items() if t in str(f.annotation)) for k, f in NodePlan.model_fields.items()}
    )
    rec.nodes["n3"] = full
    assert RecordEncoder().encode(rec)["nodes"]["n3"] == full.model_dump(mode="json")


def test_a_jobs_ranks_are_stored_as_runs_and_any_placement_and_the_old_map_read_back() -> None:
    from powerguard.coordinator.record import JobPlan

    strided = {r: f"n{r % 3}" for r in range(12)}  # no two consecutive ranks on one node
    packed = {r: f"n{r // 4}" for r in range(12)}
    for ranks in (strided, packed, {}):
        rec = SagaRecord(saga_id="s", site="x", created_at=0.0, updated_at=0.0)
        rec.jobs["j"] = JobPlan(job="j", request_id="r", world_size=len(ranks), ranks=ranks)
        rec.carried["k"] = JobPlan(job="k", request_id="r", world_size=len(ranks), ranks=ranks)
        assert decode(json.loads(json.dumps(encode(rec)))) == rec
    assert ranks_as_runs(packed) == [[0, 4, "n0"], [4, 4, "n1"], [8, 4, "n2"]]
    assert len(ranks_as_runs(strided)) == 12
    old = {"saga_id": "s", "site": "x", "created_at": 0, "updated_at": 0}
    old["jobs"] = {"j": {"job": "j", "request_id": "r", "world_size": 2, "ranks": {"0": "a", "1": "b"}}}
    assert decode(old).jobs["j"].ranks == {0: "a", 1: "b"}  # written before runs


STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("ack"), st.sampled_from(["j1", "j2", "j3"]), st.integers(0, 3), st.booleans()),
        st.tuples(st.just("node"), st.sampled_from(["n1", "n2", "n3", "n4"]), st.sampled_from(["off", "on", "ready"])),
        st.tuples(st.just("power"), st.sampled_from(["A", "B"]), st.booleans(), st.sampled_from([30.0, 300.0, None])),
        st.tuples(st.just("advance"), st.sampled_from([1.0, 30.0, 200.0])),
        st.tuples(st.just("resumed"), st.sampled_from(["j1", "j2", "j3"])),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(STEPS)
def test_what_the_store_writes_after_every_input_reads_back_as_the_record_in_memory(steps):
    """The store's way (one encoder and one split memo per saga, a part's key kept while its bytes
    are): after every input the stored head and parts join and decode to the record in memory, and
    are byte for byte what a fresh encoder and split would store."""
    limits = PartLimits(inline_bytes=256, container_bytes=96, part_bytes=384)
    d = Drive()
    d.power("A", True)
    encoder, memo = RecordEncoder(), SplitMemo()
    table: dict[str, tuple[bytes, str]] = {}  # name -> (content, key), as the store keeps them
    writes = 0

    def stored_way() -> tuple[dict, dict[str, bytes]]:
        nonlocal table, writes
        new: dict[str, tuple[bytes, str]] = {}
        writes += 1

        def key_for(name: str, content: bytes) -> str:
            same = table.get(name)
            new[name] = same if same is not None and same[0] == content else (content, f"{name}@{writes}")
            return new[name][1]

        head, parts = split(encoder.encode(d.rec), limits=limits, key_for=key_for, memo=memo)
        table = new
        return head, parts

    for step in steps:
        kind, *args = step
        if kind == "ack":
            job, rank, ok = args
            if job in d.rec.jobs and rank < d.rec.jobs[job].world_size:
                d.ack(job, rank, ok=ok)
        elif kind == "node":
            d.node(*args)
        elif kind == "power":
            d.power(args[0], args[1], runtime_s=args[2])
        elif kind == "advance":
            d.advance(args[0])
        else:
            d.resumed(args[0])
        head, parts = stored_way()
        assert decode(join(head, parts)) == d.rec
        fresh_head, fresh_parts = split(encode(d.rec), limits=limits, key_for=lambda name, content: name)
        assert json.dumps(join(head, parts)) == json.dumps(join(fresh_head, fresh_parts))
        unkeyed = sorted(re.sub(rb"@\d+", b"", v) for v in parts.values())  # parts named by their keys
        assert unkeyed == sorted(fresh_parts.values())  # the same bytes, part for part
