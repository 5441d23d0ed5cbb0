"""ups-monitor settings: the ``ups_monitor:`` section of the site YAML and per-UPS options."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from powerguard.schemas import SecretRef
from powerguard.snmp import SnmpCredentials


class MonitorSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    poll_interval_s: float = Field(default=1.0, gt=0)
    comm_timeout_s: float = Field(default=10.0, gt=0, description="No good reading this long: comm_lost")
    status_every_s: float = Field(default=30.0, gt=0, description="Telemetry events")
    timeout_s: float = Field(default=2.0, gt=0, description="One poll of one UPS")
    max_concurrent_polls: int = Field(default=64, ge=1)
    trap_host: str | None = Field(
        default=None, description="Address to listen on for SNMP traps (required with trap_port; no 0.0.0.0 default)"
    )
    trap_port: int | None = Field(default=None, ge=0, le=65535, description="UDP port for traps (None: off)")
    trap_community: SecretRef | None = Field(
        default=None, description="v2c trap community (required to accept v2c traps; SNMPv3 authPriv is recommended)"
    )
    trap_rate_per_s: float = Field(
        default=2.0, gt=0, description="Trap-triggered polls per second per sender; more traps are dropped and counted"
    )


class NutOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    ups_name: str | None = Field(default=None, description="The UPS name on upsd (default: the site's name)")
    user: str | None = None
    password: SecretRef | None = None


class SnmpOptions(SnmpCredentials):
    """A UPS over SNMP: the shared v2c/v3 credentials (v2c community default 'public'), and
    which MIB to read."""

    profile: str = Field(default="auto", pattern=r"^(auto|ups-mib|apc)$")
    retries: int = Field(default=0, ge=0)
    trap_engine_id: str | None = Field(default=None, description="Sender's engine id (hex) for SNMPv3 traps")
