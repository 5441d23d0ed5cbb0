"""The rank's queue of checkpoint requests: a re-sent request is one request, and a re-send
with an earlier deadline (the coordinator's battery budget shrank) moves its deadline."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

from powerguard.bus import BusNames
from powerguard.ckpt_agent._bus import BusThread
from powerguard.schemas import AgentData, CheckpointRequestData, CheckpointRequested


def request(deadline_s: float) -> SimpleNamespace:
    data = CheckpointRequestData(
        job="j",
        request_id="s1/j/ckpt",
        saga_id="s1",
        deadline=datetime.now(UTC) + timedelta(seconds=deadline_s),
        reason="power",
    )
    return SimpleNamespace(event=CheckpointRequested(data=data), headers={})


def test_a_resent_request_with_an_earlier_deadline_moves_the_deadline():
    t = BusThread(url="nats://127.0.0.1:1", names=BusNames(), agent=AgentData(job="j", rank=0, world_size=1, node="n"))
    t._take(request(120))
    t._take(request(200))  # a plain re-send: later deadline, nothing changes
    assert len(t.requests) == 1 and t.requests[0].deadline_ts > datetime.now(UTC).timestamp() + 100
    t._take(request(30))  # the battery shrank: the coordinator says so
    assert len(t.requests) == 1 and t.requests[0].deadline_ts < datetime.now(UTC).timestamp() + 31
    t.acked.add("s1/j/ckpt")
    t._take(request(5))  # answered already: nothing
    assert t.pending() is None
