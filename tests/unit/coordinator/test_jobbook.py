"""The jobs the site knows, kept durable (jobbook.py): a job the registry lost is still asked for
its checkpoint, and its gauges stay, after a restart of the coordinator or of the broker."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from powerguard.coordinator.core import SiteCore
from powerguard.coordinator.jobbook import JobBook, KnownJob
from powerguard.coordinator.topology import AgentRegistry
from powerguard.schemas import AgentData

from .harness import POLICY, TOPO
from .site import Site

NODES = frozenset(TOPO.feeds)


def rank(job: str, r: int, world: int, node: str, **kw) -> AgentData:
    return AgentData(job=job, rank=r, world_size=world, node=node, **kw)


def stored_and_read_back(book: JobBook) -> JobBook:
    """What a coordinator that starts (restart, upgrade, failover) reads back from the store."""
    save, _ = book.dirty()
    again = JobBook(NODES)
    again.load({k.job: k.encode() for k in save})
    return again


def test_a_job_the_registry_lost_is_asked_for_its_checkpoint_after_a_restart():
    """Before: the registry lives in the servers' memory; after the management host lost power
    the saga saw "0 job(s) at risk" and powered the nodes off under the running job."""
    book = JobBook(NODES)
    for r, node in enumerate(["n1", "n1", "n2", "n2"]):
        book.heard(rank("j1", r, 4, node, hold_policy="pause"), 900.0)
    after_restart = stored_and_read_back(book)
    s = Site()
    s.core = SiteCore(TOPO, POLICY, registry=AgentRegistry(), book=after_restart, saga_id=lambda site, now: "s1")
    s.send(s.power("A", True))
    rec = s.core.open["s1"]
    assert set(rec.jobs) == {"j1"} and rec.jobs["j1"].world_size == 4
    assert set(rec.jobs["j1"].ranks.values()) == {"n1", "n2"} and rec.jobs["j1"].hold_policy == "pause"
    assert [c.target for c in s.commands if c.kind == "ckpt_request"] == ["j1"]
    s.send(*s.acks("s1", "j1"))  # its ranks, still running, answer the request on their own subject
    assert rec.jobs["j1"].settled_at is not None


def test_without_the_book_the_same_outage_finds_no_job():
    """The control: the registry alone (empty after a broker restart) protects nothing."""
    s = Site()
    s.core = SiteCore(TOPO, POLICY, registry=AgentRegistry(), saga_id=lambda site, now: "s1")
    s.send(s.power("A", True))
    assert s.core.open["s1"].jobs == {}


def test_a_job_that_deregistered_or_stayed_silent_too_long_leaves_the_book():
    book = JobBook(NODES, forget_after_s=100)
    book.heard(rank("a", 0, 1, "n1"), 0.0)
    book.heard(rank("b", 0, 1, "n2"), 50.0)
    book.dirty()
    book.ended("a")
    assert book.forget_silent(120.0) == []
    assert book.forget_silent(151.0) == ["b"]
    assert book.dirty() == ([], ["a", "b"])


def test_the_book_keeps_only_the_sites_nodes_and_ranks_within_the_world():
    book = JobBook(NODES)
    book.heard(rank("j", 0, 2, "elsewhere"), 1.0)  # a node the site does not have: never at risk
    assert book.jobs == {}
    book.heard(rank("j", 1, 2, "n1"), 1.0)
    book.heard(rank("j", 0, 2, "n2"), 1.0)
    raw = book.jobs["j"].encode()
    assert KnownJob.decode(raw, frozenset({"n1"})).ranks == {1: "n1"}


def test_the_gauges_keep_a_known_job_the_registry_lacks_at_zero_ranks_heard():
    book = JobBook(NODES)
    book.heard(rank("j", 0, 8, "n1", credential_expires=5000.0), 10.0)
    (h,) = book.health({}).values()
    assert (h.heard, h.world_size, h.heard_at, h.credential_expires) == (0, 8, 10.0, 5000.0)


def test_a_job_heard_again_is_stored_again_only_after_the_refresh():
    book = JobBook(NODES)
    book.heard(rank("j", 0, 1, "n1"), 0.0)
    assert [k.job for k in book.dirty()[0]] == ["j"]
    book.heard(rank("j", 0, 1, "n1"), 30.0)
    assert book.dirty() == ([], [])
    book.heard(rank("j", 0, 1, "n1"), 61.0)
    assert [k.job for k in book.dirty()[0]] == ["j"]


@given(
    st.lists(
        st.tuples(st.integers(0, 63), st.sampled_from(sorted(NODES))),
        min_size=1,
        max_size=64,
    )
)
def test_stored_ranks_read_back_as_they_were(placed):
    book = JobBook(NODES)
    for r, node in placed:
        book.heard(rank("j", r, 64, node), 1.0)
    back = KnownJob.decode(book.jobs["j"].encode(), NODES)
    assert back.ranks == book.jobs["j"].ranks and back.world_size == 64
    assert math.isclose(back.heard_at, 1.0)


def test_a_job_back_in_the_registry_by_half_its_ranks_keeps_its_other_nodes():
    """After the registry's loss the ranks come back one heartbeat at a time. Before: a job heard
    again from node n1's ranks only was taken to run on n1 alone, and its restart went out once n1
    was ready, while n2 had no power yet (the campaign's mgmt-cut, seeds 104 and 115: the
    simulated scheduler refused to start it, and the restore timed out)."""
    book = JobBook(NODES)
    for r, node in enumerate(["n1", "n1", "n2", "n2"]):
        book.heard(rank("j1", r, 4, node), 900.0)
    registry = AgentRegistry()
    for r in (0, 1):  # n1's ranks beat first
        registry.update(rank("j1", r, 4, "n1"), 1000.0)
    s = Site()
    s.core = SiteCore(TOPO, POLICY, registry=registry, book=stored_and_read_back(book), saga_id=lambda *_: "s1")
    s.send(s.power("A", True))
    assert s.core.open["s1"].jobs["j1"].ranks == {0: "n1", 1: "n1", 2: "n2", 3: "n2"}
