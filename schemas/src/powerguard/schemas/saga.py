"""Saga state changes from the coordinator: ``pg.saga.<saga_id>``."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import AwareDatetime, Field

from .envelope import Data, Envelope
from .subjects import Subjects


class SagaState(StrEnum):
    DETECTED = "detected"
    CHECKPOINTING = "checkpointing"
    CHECKPOINTED = "checkpointed"
    PARTIAL = "partial"
    HOLDING = "holding"
    FINAL_CHECKPOINT = "final_checkpoint"
    SHUTTING_DOWN = "shutting_down"
    DOWN = "down"
    PARTLY_DOWN = "partly_down"  # the shutdown ended with some node's off failed (named in the reason)
    RESTORING = "restoring"
    RESUMED = "resumed"
    DONE = "done"
    CANCELLED = "cancelled"
    FAILED = "failed"

    # The state classes, one definition for every service, the console and the drills.
    @property
    def terminal(self) -> bool:
        """The saga is over (done, cancelled or failed)."""
        return self in (SagaState.DONE, SagaState.CANCELLED, SagaState.FAILED)

    @property
    def before_shutdown(self) -> bool:
        """No node of the saga has been told to power off yet."""
        return self in _BEFORE_SHUTDOWN

    @property
    def after_shutdown(self) -> bool:
        """Its shutdown is over: restoring, resumed, or ended (a shutdown command is stale)."""
        return self in (SagaState.RESTORING, SagaState.RESUMED) or self.terminal

    @property
    def restarts_nothing(self) -> bool:
        """It resumed every job (resumed, done) or ended before any shutdown (cancelled): a job
        restart is stale. Not "failed": a restore can time out with a restart in flight."""
        return self in (SagaState.RESUMED, SagaState.DONE, SagaState.CANCELLED)

    @property
    def down(self) -> bool:
        """The shutdown ended (every off done, or some failed): the one time a UPS's output is cut."""
        return self in (SagaState.DOWN, SagaState.PARTLY_DOWN)

    @property
    def powered_down(self) -> bool:
        """Nodes are going off, off, or coming back (the site runs short of nodes)."""
        return self in (SagaState.SHUTTING_DOWN, SagaState.RESTORING) or self.down

    @property
    def checkpoint_deadline(self) -> bool:
        """The saga waits for ranks' acks before a deadline (its ``deadline`` is theirs)."""
        return self in (SagaState.CHECKPOINTING, SagaState.FINAL_CHECKPOINT)


_BEFORE_SHUTDOWN = frozenset(
    {
        SagaState.DETECTED,
        SagaState.CHECKPOINTING,
        SagaState.CHECKPOINTED,
        SagaState.PARTIAL,
        SagaState.HOLDING,
        SagaState.FINAL_CHECKPOINT,
    }
)


class SagaData(Data):
    saga_id: str
    site: str
    ups: list[str] = Field(default_factory=list, description="UPSes on battery in this outage")
    state: SagaState
    previous: SagaState | None = None
    reason: str | None = None
    jobs: list[str] = Field(default_factory=list)
    nodes: list[str] = Field(default_factory=list, description="Nodes at risk")
    missing_ranks: dict[str, list[int]] = Field(
        default_factory=dict, description="job -> ranks that did not ack (state partial)"
    )
    deadline: AwareDatetime | None = None
    lost_steps: dict[str, int] = Field(
        default_factory=dict,
        description="job -> training steps lost at the stop (trained after its last durable checkpoint)",
    )
    drill: bool = Field(
        default=False,
        description="A drill's saga (`powerguard drill`): every power and job command it sends is dry-run, and "
        "nothing it does changes a real saga",
    )


class SagaStateChanged(Envelope):
    type: Literal["io.powerguard.saga.v1.state_changed"] = "io.powerguard.saga.v1.state_changed"
    data: SagaData
    SUBJECT_TEMPLATE = "{prefix}.saga.{saga_id}"

    def nats_subject(self, subjects: Subjects) -> str:
        return subjects.saga(self.data.saga_id)
