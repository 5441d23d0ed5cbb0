"""The rank's queue of checkpoint requests (``_requests.RequestQueue``, pure: no thread, no
clock): a re-sent request is one request, a re-send with an earlier deadline (the
coordinator's battery budget shrank) moves its deadline, an answered request is answered
once, and one past its deadline is reported once."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from powerguard.ckpt_agent._requests import RequestQueue
from powerguard.schemas import CheckpointRequestData

T0 = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)


def request(deadline_s: float, rid: str = "s1/j/ckpt", saga: str = "s1") -> CheckpointRequestData:
    return CheckpointRequestData(
        job="j", request_id=rid, saga_id=saga, deadline=T0 + timedelta(seconds=deadline_s), reason="power"
    )


def test_a_resent_request_with_an_earlier_deadline_moves_the_deadline():
    q, now = RequestQueue(), T0.timestamp()
    assert q.take(request(120), now=now) == "new"
    assert q.take(request(200), now=now) is None  # a plain re-send: later deadline, nothing changes
    assert len(q.requests) == 1 and q.pending().deadline_ts == now + 120
    assert q.take(request(30), now=now) == "deadline"  # the battery shrank: the coordinator says so
    assert len(q.requests) == 1 and q.pending().deadline_ts == now + 30 and q.seq == 1
    assert q.answer([request(30)]) == [request(30)]
    assert q.take(request(5), now=now) is None  # answered already: nothing
    assert q.pending() is None


def test_the_newest_unanswered_request_is_pending_and_each_is_answered_once():
    q, now = RequestQueue(), T0.timestamp()
    q.take(request(60, "s1/j/ckpt"), now=now)
    q.take(request(60, "s1/j/hold.1"), now=now)
    assert q.pending().data.request_id == "s1/j/hold.1" and q.seq == 2
    first = q.answer([request(60, "s1/j/ckpt"), request(60, "s1/j/hold.1")])
    assert [r.request_id for r in first] == ["s1/j/ckpt", "s1/j/hold.1"]
    assert q.answer([request(60, "s1/j/hold.1")]) == []  # another rank's answer of the same: not again
    assert q.pending() is None


def test_a_request_past_its_deadline_is_reported_once_and_then_answered():
    q, now = RequestQueue(), T0.timestamp()
    q.take(request(10, "s1/j/ckpt"), now=now)
    q.take(request(50, "s1/j/final"), now=now)
    assert q.overdue(now + 5) == []
    assert [r.data.request_id for r in q.overdue(now + 11)] == ["s1/j/ckpt"]
    assert q.overdue(now + 12) == []  # reported once
    assert q.pending().data.request_id == "s1/j/final"
    assert q.answer([request(10, "s1/j/ckpt")]) == []  # its failure was its answer


def test_a_pause_ends_only_once_every_saga_that_paused_it_released_it():
    q = RequestQueue()
    assert q.all_released(set())
    q.release("drill")
    assert q.all_released({"drill"}) and not q.all_released({"drill", "real"})
    q.release("real")
    assert q.all_released({"drill", "real"})
