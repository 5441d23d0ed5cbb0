"""The site's published status: what the coordinator says about each outage saga, for tools.

The coordinator writes one :class:`SagaStatus` per saga into the ``pg_status`` KV bucket
(key ``saga.<saga_id>``) whenever the saga changes (at most about once a second while acks
arrive, at once on every state change). The operator console, ``powerguard status`` and
``powerguard drill`` read it and nothing else of the coordinator: its own record
(``pg_sagas``) is its private storage, which it may change between releases. An outside tool
builds the same page from this schema alone (``schemas/generated/kv_saga_status_v1.schema.json``).

Versioned like the events: ``schema`` names the version; a new optional field keeps it, a
changed or removed one makes a new version (the old one published beside it for a release).
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .saga import SagaState

STATUS_SCHEMA = "io.powerguard.status.v1.saga"
SITE_STATUS_SCHEMA = "io.powerguard.status.v1.site"


class SiteStatus(BaseModel):
    """The site as its leading coordinator publishes it when it takes the lead (key
    ``site.<site>``): who leads, and the policy figures tools show beside the UPSes' runtimes."""

    model_config = ConfigDict(extra="ignore")

    schema_: Literal["io.powerguard.status.v1.site"] = Field(default=SITE_STATUS_SCHEMA, alias="schema")
    site: str
    coordinator: str = Field(description="The instance that leads the site")
    version: str | None = Field(default=None, description="Its release")
    published_at: float
    shutdown_reserve_s: float = Field(description="Runtime kept for the shutdown: the hold ends at it")
    ckpt_timeout_s: float = Field(description="The longest a power checkpoint may take")
    margin_s: float = Field(description="Safety margin of the battery budget")
    hold_policy: str = Field(description="The site's default hold policy")
    ups_alone: dict[str, list[str]] = Field(
        default_factory=dict, description="UPS -> the nodes at risk when it alone is on battery (a drill's nodes)"
    )


class StatusTransition(BaseModel):
    state: SagaState
    at: float = Field(description="Unix time of the transition")
    reason: str | None = None


class RestoreProgress(BaseModel):
    asked: int = Field(description="Nodes asked to power on")
    ready: int = Field(description="Of those, ready")
    in_ramp: int = Field(description="Of those, held back by the power-on ramp")
    ramp: str | None = Field(default=None, description="What the ramp said last, e.g. 'starts in 42.0s'")


class JobFigures(BaseModel):
    """A job in the outage: where it checkpointed, stopped and resumed; what it lost."""

    hold_policy: str
    step_at_detection: int | None = None
    checkpoint_step: int | None = None
    final_checkpoint_step: int | None = None
    final_checkpoint: str | None = Field(default=None, description="How the final checkpoint ended, or why none")
    stop_step: int | None = None
    stop_step_exact: bool = False
    steps_since_checkpoint: int | None = None
    durable_step: int | None = None
    resumed_step: int | None = None
    lost_steps: int | None = None
    lost_steps_at_least: bool = False
    lost_s: float | None = None
    kept_steps: int | None = None


class BatteryFigures(BaseModel):
    """A UPS's first runtime estimate against what its observed discharge gave."""

    predicted_s: float | None = None
    observed_s: float | None = None
    ratio: float | None = None
    load_pct: float | None = None


class SagaStatus(BaseModel):
    """One outage saga as the coordinator last published it."""

    model_config = ConfigDict(extra="ignore")  # a newer coordinator's optional fields

    schema_: Literal["io.powerguard.status.v1.saga"] = Field(default=STATUS_SCHEMA, alias="schema")
    saga: str
    site: str
    state: SagaState
    drill: bool = False
    reason: str | None = None
    published_at: float = Field(description="Unix time the coordinator published this status")
    started: float = Field(description="Unix time the saga started")
    state_at: float = Field(description="Unix time of the current state")
    acks_received: int = 0
    acks_expected: int = 0
    deadline: float | None = Field(
        default=None, description="The ranks' checkpoint deadline (Unix time) while the saga waits for acks"
    )
    ups_on_battery: list[str] = Field(default_factory=list)
    nodes_at_risk: list[str] = Field(default_factory=list)
    missing: dict[str, list[int]] = Field(default_factory=dict, description="job -> ranks that did not ack")
    restore: RestoreProgress | None = None
    ups_off: dict[str, str] = Field(default_factory=dict, description="UPS told to cut its output -> what it said")
    trace_id: str | None = None
    history: list[StatusTransition] = Field(default_factory=list)
    lost_steps: int | None = None
    hold_s: float | None = None
    stop_reason: str | None = None
    runtime_at_stop_s: float | None = None
    charge_at_stop_pct: float | None = None
    rto_s: float | None = None
    jobs: dict[str, JobFigures] = Field(default_factory=dict)
    battery: dict[str, BatteryFigures] = Field(default_factory=dict)
    nodes_not_off: dict[str, str] = Field(default_factory=dict, description="node -> why its off failed")
    shutdown_reserve_s: float | None = Field(default=None, description="The site's shutdown reserve (policy)")
    ckpt_timeout_s: float | None = Field(default=None, description="The site's checkpoint budget cap (policy)")
    runtime_s: float | None = Field(default=None, description="Runtime left for the nodes at risk, at publishing")
    budget_s: float | None = Field(
        default=None, description="Seconds a checkpoint requested at publishing may take (the battery budget)"
    )
    stop_at_runtime_s: float | None = Field(
        default=None,
        description="The runtime at which the saga stops the jobs (the reserve, earlier for a final checkpoint "
        "given the checkpoints measured in this outage)",
    )

    @property
    def terminal(self) -> bool:
        return self.state.terminal

    def row(self, now: float | None = None) -> dict[str, Any]:
        """The status as the tools show it at ``now``: with the budget left and the age."""
        now = time.time() if now is None else now
        budget = None
        if self.state.checkpoint_deadline and self.deadline is not None:
            budget = round(max(0.0, self.deadline - now), 1)
        out = self.model_dump(mode="json", exclude={"schema_", "history", "acks_received", "acks_expected"})
        out["state"] = self.state.value
        out["acks"] = f"{self.acks_received}/{self.acks_expected}"
        out["budget_left_s"] = budget
        out["age_s"] = round(now - self.started, 1)
        return out
