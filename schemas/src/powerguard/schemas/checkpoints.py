"""Checkpoint requests (``pg.ckpt.<job>.request``) and acks (``pg.ckpt.<job>.<rank>.ack``)."""

from __future__ import annotations

from typing import Literal

from pydantic import AwareDatetime, Field

from .agents import Tier
from .envelope import Data, Envelope
from .subjects import Subjects


class CheckpointRequestData(Data):
    request_id: str = Field(description="Unique per request; acks echo it")
    saga_id: str | None = None
    job: str
    reason: Literal["power", "periodic", "manual", "drill"] = "power"
    deadline: AwareDatetime = Field(description="Every rank must be durable by then")
    tiers: list[Tier] = Field(default_factory=lambda: ["local"])


class CheckpointRequested(Envelope):
    type: Literal["io.powerguard.ckpt.v1.requested"] = "io.powerguard.ckpt.v1.requested"
    data: CheckpointRequestData
    SUBJECT_TEMPLATE = "{prefix}.ckpt.{job}.request"

    def nats_subject(self, subjects: Subjects) -> str:
        return subjects.ckpt_request(self.data.job)


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
    rank: int = Field(ge=0)
    world_size: int | None = Field(default=None, ge=1)
    step: int | None = Field(default=None, ge=0)
    tier: Tier = "local"


class CheckpointDurableData(CheckpointAckData):
    step: int = Field(ge=0)
    path: str = Field(description="Checkpoint directory (URL for the remote tier)")
    bytes: int = Field(ge=0, description="Bytes this rank wrote")
    durations: Durations = Field(default_factory=Durations)
    digest: str = Field(description="xxh3-128 of this rank's manifest")


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
