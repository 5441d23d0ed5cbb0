"""Agent registration and heartbeats from ckpt-agent: ``pg.agent.<job>.<rank>``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from .envelope import Data, Envelope
from .subjects import Subjects

Tier = Literal["local", "remote"]
MAX_WORLD_SIZE = 1 << 20  # a bound the coordinator can iterate: a registration cannot make it hang
HoldPolicy = Literal["checkpoint-at-stop", "pause", "continue"]  # see checkpoints.py
HOLD_POLICIES: tuple[str, ...] = ("checkpoint-at-stop", "pause", "continue")


class AgentData(Data):
    job: str
    rank: int = Field(ge=0, lt=MAX_WORLD_SIZE)
    world_size: int = Field(ge=1, le=MAX_WORLD_SIZE, description="Ranks of the job (at most 2**20)")
    node: str = Field(description="Node name as in the site YAML")
    pid: int | None = None
    tiers: list[Tier] = Field(default_factory=lambda: ["local"])
    step: int | None = Field(default=None, ge=0, description="Current training step")
    last_committed_step: int | None = Field(default=None, ge=0)
    heartbeat_s: float = Field(default=5.0, gt=0, description="Heartbeat interval")
    hold_policy: HoldPolicy | None = Field(
        default=None, description="This job's hold policy (None: the site's default)"
    )
    paused_step: int | None = Field(
        default=None, ge=0, description="Waiting at this step boundary (a pause after a checkpoint)"
    )
    credential_expires: float | None = Field(
        default=None,
        description="When this rank's NATS credential expires (Unix time, its JWT's exp; None: never or unknown): "
        "the coordinator exports it so an expiry is seen coming",
    )

    @model_validator(mode="after")
    def _rank_in_world(self) -> AgentData:
        if self.rank >= self.world_size:
            raise ValueError(f"rank {self.rank} is not below world_size {self.world_size}")
        return self


class AgentEvent(Envelope):
    data: AgentData
    SUBJECT_TEMPLATE = "{prefix}.agent.{job}.{rank}"

    def nats_subject(self, subjects: Subjects) -> str:
        return subjects.agent(self.data.job, self.data.rank)


class AgentRegistered(AgentEvent):
    type: Literal["io.powerguard.agent.v1.registered"] = "io.powerguard.agent.v1.registered"


class AgentHeartbeat(AgentEvent):
    type: Literal["io.powerguard.agent.v1.heartbeat"] = "io.powerguard.agent.v1.heartbeat"


class AgentDeregistered(AgentEvent):
    type: Literal["io.powerguard.agent.v1.deregistered"] = "io.powerguard.agent.v1.deregistered"
