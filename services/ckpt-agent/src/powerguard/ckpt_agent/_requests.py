"""A rank's checkpoint requests and releases: what arrived, what this rank answered, which
sagas released its pause. Pure: requests in, the one to answer out; no thread, no clock of its
own (every call that needs the time takes ``now``). The bus thread (``_bus.py``) feeds it from
NATS and the training thread asks it, under the bus thread's lock."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from powerguard.schemas import CheckpointRequestData


@dataclass
class Request:
    seq: int
    data: CheckpointRequestData
    received: float
    traceparent: str | None = None  # the request's trace: the checkpoint span and the acks join it

    @property
    def deadline_ts(self) -> float:
        return self.data.deadline.timestamp()


class RequestQueue:
    def __init__(self) -> None:
        self.requests: deque[Request] = deque()
        self.seq = 0  # how many distinct requests arrived
        self.answered: set[str] = set()  # request ids this rank answered (an ack, or a failure)
        self.released: set[str | None] = set()  # saga ids whose paused ranks may train on

    def take(self, data: CheckpointRequestData, *, now: float, traceparent: str | None = None) -> str | None:
        """One request as received; returns what changed ("new", "deadline"), or None (a
        plain re-send, or one answered already)."""
        if data.request_id in self.answered:
            return None
        same = next((r for r in self.requests if r.data.request_id == data.request_id), None)
        if same is not None:  # a re-send; with an earlier deadline when the battery shrank it
            if data.deadline < same.data.deadline:
                same.data = data
                return "deadline"
            return None
        self.seq += 1
        self.requests.append(Request(self.seq, data, now, traceparent))
        return "new"

    def pending(self) -> Request | None:
        """The newest request not answered yet (older ones are covered by the same checkpoint)."""
        for r in reversed(self.requests):
            if r.data.request_id not in self.answered:
                return r
        return None

    def answer(self, requests: list[CheckpointRequestData]) -> list[CheckpointRequestData]:
        """Mark these requests answered; returns those not answered before (to publish once). A
        request another rank saw first is answered too, and ignored when it arrives here later."""
        todo = [r for r in requests if r.request_id not in self.answered]
        self.answered.update(r.request_id for r in todo)
        return todo

    def overdue(self, now: float) -> list[Request]:
        """Requests past their deadline and not answered: marked answered (each once), for the
        rank to report failed."""
        late = [r for r in self.requests if r.data.request_id not in self.answered and now > r.deadline_ts]
        self.answered.update(r.data.request_id for r in late)
        return late

    def release(self, saga_id: str | None) -> None:
        self.released.add(saga_id)

    def all_released(self, sagas: set[str | None]) -> bool:
        """A release arrived for every one of these sagas (each saga that paused the ranks)."""
        return sagas <= self.released
