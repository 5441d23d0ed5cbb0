"""Saga policy: the knobs of the ``coordinator:`` section of the site YAML."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class Policy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    ckpt_timeout_s: float = Field(default=120.0, gt=0, description="Upper bound of a checkpoint deadline")
    shutdown_reserve_s: float = Field(default=60.0, ge=0, description="Battery runtime kept for the shutdown itself")
    margin_s: float = Field(default=10.0, ge=0, description="Safety margin on the checkpoint deadline")
    max_on_battery_s: float = Field(default=900.0, gt=0, description="Shut down after this long regardless")
    restore_stable_s: float = Field(default=30.0, ge=0, description="On line this long before restoring")
    min_restart_charge_pct: float = Field(default=30.0, ge=0, le=100)
    shutdown_timeout_s: float = Field(default=300.0, gt=0, description="Give up waiting for nodes to report off")
    restore_timeout_s: float = Field(default=900.0, gt=0, description="Nodes ready and jobs resumed by then")
    tick_s: float = Field(default=0.25, gt=0, description="How often deadlines are checked")
    lease_ttl_s: float = Field(default=10.0, gt=0, description="Leader lease; a standby takes over after it")
