"""Checkpoint requests (``pg.ckpt.<job>.request``), acks (``pg.ckpt.<job>.<rank>.ack``) and
hold releases (``pg.ckpt.<job>.release``).

The hold policy says what a job does between its power checkpoint and the end of the outage:

- ``checkpoint-at-stop`` (default): training goes on; when the coordinator decides to shut
  down, every rank takes a final checkpoint at one step and waits there until it is stopped,
  so nothing trained is lost at the stop.
- ``pause``: after the power checkpoint every rank waits at the next step boundary until power
  returns (a release: training continues in place) or the shutdown comes (nothing new to save).
- ``continue``: training goes on and whatever it trains after the checkpoint is lost at the stop.
"""

from __future__ import annotations

from typing import Literal

from pydantic import AwareDatetime, Field, model_validator

from .agents import HOLD_POLICIES, MAX_WORLD_SIZE, HoldPolicy, Tier  # noqa: F401 (re-exported)
from .envelope import Data, Envelope
from .subjects import Subjects

MAX_RANK_SPANS = 512  # one ack's rank spans: a job's ranks are one span; an ack stays far under the agent's payload


class CheckpointRequestData(Data):
    request_id: str = Field(description="Unique per request; acks echo it")
    saga_id: str | None = None
    job: str
    reason: Literal["power", "final", "hold", "periodic", "manual", "drill"] = "power"
    deadline: AwareDatetime = Field(description="Every rank must be durable by then")
    tiers: list[Tier] = Field(default_factory=lambda: ["local"])
    then: Literal["continue", "pause"] = Field(
        default="continue",
        description="After the checkpoint is durable: train on, or wait at the step boundary until a release "
        "(or the job is stopped)",
    )
    pause_max_s: float | None = Field(
        default=None, gt=0, description="A paused rank trains on by itself after this long without a release"
    )
    acks: Literal["rank", "job"] = Field(
        default="rank",
        description="How the checkpoint is acked durable: every rank for itself, or (``job``: the requester "
        "takes it) one ack from rank 0 that names every rank of the committed checkpoint (``ranks``): what the "
        "COMMIT says, in one message instead of one per rank",
    )


class ReleaseData(Data):
    job: str
    saga_id: str | None = None
    reason: str = Field(default="power back", description="Why the paused ranks may train on")


class HoldReleased(Envelope):
    """Paused ranks of this job train on (power came back before the shutdown)."""

    type: Literal["io.powerguard.ckpt.v1.released"] = "io.powerguard.ckpt.v1.released"
    data: ReleaseData
    SUBJECT_TEMPLATE = "{prefix}.ckpt.{job}.release"

    def nats_subject(self, subjects: Subjects) -> str:
        return subjects.ckpt_release(self.data.job)


class CheckpointRequested(Envelope):
    type: Literal["io.powerguard.ckpt.v1.requested"] = "io.powerguard.ckpt.v1.requested"
    data: CheckpointRequestData
    SUBJECT_TEMPLATE = "{prefix}.ckpt.{job}.request"

    def nats_subject(self, subjects: Subjects) -> str:
        return subjects.ckpt_request(self.data.job)


class CheckpointTriggered(Envelope):
    """A rank's own HTTP trigger (``POST /api/v1/trigger_checkpoint``) asks its job for a
    checkpoint: every rank of the job honours it as a request, at one step. On the job's own
    subject (its agents' stream): no agent writes to the site's events stream."""

    type: Literal["io.powerguard.ckpt.v1.triggered"] = "io.powerguard.ckpt.v1.triggered"
    data: CheckpointRequestData
    SUBJECT_TEMPLATE = "{prefix}.ckpt.{job}.trigger"

    def nats_subject(self, subjects: Subjects) -> str:
        return subjects.ckpt_trigger(self.data.job)


class Durations(Data):
    agree_s: float = Field(default=0.0, ge=0, description="Waiting for all ranks to agree on a step")
    stage_s: float = Field(default=0.0, ge=0, description="Copying state off the device")
    write_s: float = Field(default=0.0, ge=0, description="Writing files incl. fsync")
    commit_s: float = Field(default=0.0, ge=0, description="Manifest + COMMIT + directory fsync")
    total_s: float = Field(default=0.0, ge=0)


class CheckpointAckData(Data):
    request_id: str | None = None
    saga_id: str | None = None
    job: str
    rank: int = Field(ge=0, lt=MAX_WORLD_SIZE)
    world_size: int | None = Field(default=None, ge=1, le=MAX_WORLD_SIZE)
    step: int | None = Field(default=None, ge=0)
    tier: Tier = "local"


class CheckpointDurableData(CheckpointAckData):
    step: int = Field(ge=0)
    path: str = Field(description="Checkpoint directory (URL for the remote tier)")
    bytes: int = Field(ge=0, description="Bytes this rank wrote")
    durations: Durations = Field(default_factory=Durations)
    digest: str = Field(description="xxh3-128 of this rank's manifest")
    commit: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{32}$",
        description="What identifies the committed checkpoint's contents (its job, step, world size and every "
        "rank's manifest digest; the same on every node and tier): the coordinator records it, and a restore takes "
        "the copy the acks named",
    )
    durability: str = Field(
        default="local",
        pattern=r"^(local|replicated:[0-9]{1,5}|remote)$",
        description="What the committed checkpoint survives: local (the tier's one copy: a shared directory, "
        "or a node's own disk), replicated:k (every file of the job is also on k other nodes' disks, so any "
        "k nodes may be lost), remote (also on the remote tier)",
    )
    ranks: list[tuple[int, int]] | None = Field(
        default=None,
        max_length=MAX_RANK_SPANS,
        description="Rank 0's ack for a request that asked for one ack per job: the ranks it speaks for, as "
        "ascending [first, last] spans (inclusive), every rank the COMMIT names; ``digest`` and ``bytes`` stay "
        "rank 0's own. None: the sender's rank alone",
    )

    def speaks_for(self) -> list[int]:
        """The ranks this ack is for: its sender's, or every rank of the spans rank 0 named."""
        if self.ranks is None:
            return [self.rank]
        return [r for first, last in self.ranks for r in range(first, last + 1)]

    def who(self) -> str:
        """``rank 3``, or ``ranks 0-7`` for rank 0's ack for the job."""
        if self.ranks is None:
            return f"rank {self.rank}"
        return "ranks " + ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in self.ranks)

    @model_validator(mode="after")
    def _spans(self) -> CheckpointDurableData:
        if self.ranks is None:
            return self
        if self.rank != 0:
            raise ValueError("only rank 0 acks for other ranks (ranks)")
        end = -1
        for first, last in self.ranks:
            if not end < first <= last < (self.world_size or MAX_WORLD_SIZE):
                raise ValueError(f"ranks: span [{first}, {last}] is not ascending, disjoint and within the world")
            end = last
        if not self.ranks or self.ranks[0][0] != 0:
            raise ValueError("ranks: the sender (rank 0) is not among them")
        return self


class RecordedData(Data):
    job: str
    saga_id: str | None = None
    step: int = Field(ge=0, description="Every rank of the job acked this step durable")
    commit: str | None = Field(default=None, pattern=r"^[0-9a-f]{32}$", description="The COMMIT the acks named")


class CheckpointRecorded(Envelope):
    """The coordinator recorded a step of this job as durable on every rank: a restore never
    picks an older one (unless the operator names it), and takes the copy the acks named."""

    type: Literal["io.powerguard.ckpt.v1.recorded"] = "io.powerguard.ckpt.v1.recorded"
    data: RecordedData
    SUBJECT_TEMPLATE = "{prefix}.ckpt.{job}.recorded"

    def nats_subject(self, subjects: Subjects) -> str:
        return subjects.ckpt_recorded(self.data.job)


class CheckpointFailedData(CheckpointAckData):
    error: str
    error_type: str = "CheckpointError"


class CheckpointAck(Envelope):
    SUBJECT_TEMPLATE = "{prefix}.ckpt.{job}.{rank}.ack"

    def nats_subject(self, subjects: Subjects) -> str:
        return subjects.ckpt_ack(self.data.job, self.data.rank)  # type: ignore[attr-defined]


class CheckpointDurable(CheckpointAck):
    """This rank's part of a checkpoint is durable and committed."""

    type: Literal["io.powerguard.ckpt.v1.durable"] = "io.powerguard.ckpt.v1.durable"
    data: CheckpointDurableData


class CheckpointFailed(CheckpointAck):
    """This rank could not make the requested checkpoint durable."""

    type: Literal["io.powerguard.ckpt.v1.failed"] = "io.powerguard.ckpt.v1.failed"
    data: CheckpointFailedData
