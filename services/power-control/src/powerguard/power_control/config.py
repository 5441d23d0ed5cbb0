"""power-control settings: the ``power_control:`` section of the site YAML."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from powerguard.schemas import SecretRef, ShutdownTimings
from powerguard.snmp import SnmpCredentials

from .ramp import RampSettings


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SchedulerSettings(_Model):
    kind: Literal["none", "slurm", "docker", "process", "command", "kubernetes"] = "none"
    options: dict[str, Any] = Field(default_factory=dict, description="Adapter settings (see the README)")


class ProbeSettings(_Model):
    """How to tell that a powered-on node is ready for its jobs (besides the BMC saying 'on')."""

    url: str = Field(description="tcp://host:port (connect succeeds) or http(s)://... (2xx answer)")
    interval_s: float = Field(default=1.0, gt=0)


class PowerControlSettings(ShutdownTimings):
    """The ``power_control:`` section. The timings that bound a node's shutdown
    (``soft_off_timeout_s``, ``device_timeout_s``, ``outlets_off_on_shutdown``,
    ``job_stop_grace_s``, ``job_stop_wait_s``) are :class:`~powerguard.schemas.ShutdownTimings`,
    which the coordinator reads from the same section."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dry_run: bool = Field(default=False, description="Log and report every action, touch nothing")
    boot_timeout_s: float = Field(default=600.0, gt=0, description="Power-on until the node is ready")
    outlet_stagger_s: float = Field(default=2.0, ge=0, description="Between two outlet-on actions (inrush)")
    max_parallel_power_on: int = Field(
        default=4, ge=1, description="Nodes at most between their BMC power-on command and 'on' (a sliding window)"
    )
    batch_interval_s: float = Field(
        default=0.0, ge=0, description="A node's place in that window stays taken this long after it is on"
    )
    ramp: RampSettings = Field(
        default_factory=RampSettings,
        description="Power-on ramp: nodes or kW per minute for the site, nodes per minute per PDU (default none)",
    )
    gather_s: float = Field(default=0.5, ge=0, description="Collect power-on commands this long, then sequence")
    poll_interval_s: float = Field(default=1.0, gt=0, description="Power state read-back while waiting")
    readback_s: float = Field(
        default=15.0,
        gt=0,
        description="A node whose last command (shutdown, power-on) has not reached its result is read back this "
        "often and reported to the saga once it has (an operator's power on by hand completes a restore)",
    )
    readback_window_s: float = Field(default=3600.0, gt=0, description="... for at most this long after the command")
    device_check_s: float = Field(
        default=60.0,
        ge=0,
        description="Check that every node's BMC and PDU outlets answer (secrets read) at start and this often; "
        "a node that cannot be acted on makes /readyz degraded, checked again every 5 s until fixed (0: never)",
    )
    retries: int = Field(default=3, ge=0, description="Retries of a failed power action (retryable errors only)")
    retry_backoff_s: float = Field(default=2.0, ge=0, description="First retry delay; doubles each time")
    auth_holdoff_s: float = Field(default=300.0, ge=0, description="After a credential failure, fail fast this long")
    max_parallel_per_driver: dict[str, int] = Field(
        default_factory=lambda: {"ipmi": 16, "redfish": 16, "pdu": 4, "dry-run": 64},
        description="Concurrent requests per driver kind",
    )
    max_command_age_s: float = Field(
        default=300.0, gt=0, description="Refuse a command older than this (a replay, or one stuck in a backlog)"
    )
    require_saga: bool = Field(
        default=True,
        description="Execute a command only of a saga the coordinator announced (its newest saga.state_changed "
        "event), in a state that allows it (no shutdown after the saga's shutdown ended; a UPS's output cut "
        "only while down)",
    )
    scheduler: SchedulerSettings = Field(default_factory=SchedulerSettings)
    probes: dict[str, ProbeSettings] = Field(default_factory=dict, description="Readiness probe per node")
    restore_policy: Literal["always-on", "previous", "always-off"] = Field(
        default="always-on", description="What `powerguard power audit --fix` sets on every BMC"
    )


class IpmiOptions(_Model):
    kg: SecretRef | None = Field(default=None, description="BMC key (K_g) if the BMC requires one")
    transport: Literal["ipmitool", "pyghmi"] = Field(
        default="ipmitool",
        description="ipmitool: one process per request, nothing shared between BMCs (a dead BMC never delays "
        "another); pyghmi: in-process, one I/O loop for every BMC (no ipmitool needed)",
    )
    cipher_suite: int = Field(
        default=3,
        ge=0,
        le=17,
        description="RMCP+ cipher suite (ipmitool -C): 3 (SHA1) everywhere, 17 (SHA256) where supported",
    )


class RedfishOptions(_Model):
    scheme: Literal["https", "http"] = "https"
    system_id: str | None = Field(
        default=None, description="Members entry under /redfish/v1/Systems (default: only one)"
    )
    ca_bundle: str | None = Field(default=None, description="PEM file of CAs to trust (default: the system's)")
    verify_tls: bool = Field(default=True, description="false only for lab BMCs with throw-away certificates")


class PduOptions(SnmpCredentials):
    """A switched PDU over SNMP: the shared v2c/v3 credentials; v2c needs the write community
    (no 'private' default)."""
