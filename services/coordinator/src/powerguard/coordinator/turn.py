"""One advance of a saga: the record, the clock, the site and what the advance issues.

Every state handler (:mod:`.states`), checkpoint-round rule (:mod:`.rounds`) and command
builder (:mod:`.commands`) takes a :class:`Turn`: the same six things, passed once."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from powerguard.schemas import SagaState

from .inputs import Command
from .policy import Policy
from .record import SagaRecord, Transition
from .topology import JobInfo, Topology

JobsArg = dict[str, JobInfo] | Callable[[], dict[str, JobInfo]] | None


def jobs_now(jobs: JobsArg) -> dict[str, JobInfo]:
    """The agent registry (called only when a rule needs it)."""
    return (jobs() if callable(jobs) else jobs) or {}


@dataclass
class Turn:
    rec: SagaRecord
    now: float
    topo: Topology
    policy: Policy
    jobs: JobsArg = None
    out: list[Command] = field(default_factory=list)
    # jobs that ended (every rank deregistered), or a function returning them; None: the caller
    # does not know, and a job absent from the registry is taken to have ended
    ended: set[str] | Callable[[], set[str]] | None = None

    def emit(self, cmd: Command) -> None:
        emit(self.rec, self.out, cmd)

    def set(self, state: SagaState, reason: str | None = None) -> None:
        set_state(self.rec, state, self.now, reason)


def emit(rec: SagaRecord, out: list[Command], cmd: Command) -> None:
    """Issue a command, at most once per saga (by its idempotency key)."""
    if cmd.key not in rec.issued:
        rec.issued.add(cmd.key)
        out.append(cmd)


def set_state(rec: SagaRecord, state: SagaState, now: float, reason: str | None = None) -> None:
    rec.state = state
    rec.reason = reason
    rec.history.append(Transition(state=state, at=now, reason=reason))
