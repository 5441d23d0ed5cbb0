"""A checkpoint round keeps the count of ranks short of the required durability as acks raise
them (``CkptRound.take``), instead of recounting the world per ack (quadratic per job: 4,096
ranks cost 1.2 ms an ack). The kept count must say what a recount says, whatever the order of
acks, raises, failures, a changed requirement and a reload from the store."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from powerguard.coordinator.record import CkptRound, meets

LEVELS = ("local", "replicated:0", "replicated:1", "replicated:2", "remote")
REQUIRE = ("local", "replicated", "remote")


def recount(rnd: CkptRound) -> bool:
    """What ``answered`` meant before the count was kept (the whole world walked)."""
    short = {r for r in rnd.acked if not meets(rnd.levels.get(r, "local"), rnd.require)}
    return all(r in rnd.failed or (r in rnd.acked and r not in short) for r in range(rnd.world_size))


event = st.one_of(
    st.tuples(st.just("ack"), st.integers(0, 5), st.sampled_from(LEVELS)),
    st.tuples(st.just("fail"), st.integers(0, 5), st.just("")),
    st.tuples(st.just("require"), st.just(0), st.sampled_from(REQUIRE)),
    st.tuples(st.just("reload"), st.just(0), st.just("")),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(event, max_size=40))
def test_the_kept_count_answers_as_a_recount_does(events):
    rnd = CkptRound(request_id="r", world_size=6, requested_at=0.0)
    for kind, rank, arg in events:
        if kind == "ack":
            rnd.take(rank, 7, arg)
        elif kind == "fail" and rank not in rnd.acked:  # as facts.ack: a failure never undoes an ack
            rnd.failed[rank] = "failed"
        elif kind == "require":
            rnd.requiring(arg)
        elif kind == "reload":  # the store's round trip: the count is made again from the fields
            rnd = CkptRound.model_validate_json(rnd.model_dump_json())
        assert rnd.answered == recount(rnd), (kind, rank, arg, rnd)
