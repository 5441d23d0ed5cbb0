"""Site topology (docs/architecture.md, "The site file"), shared by every service.

UPSes, PDUs and nodes live here; jobs are not configured (agents register them).
Credentials are *references* (``{env: NAME}`` or ``{file: PATH}``), never values, so the
YAML can be committed and the secrets never reach logs or events.

Service-specific sections (``coordinator:``, ``ups_monitor:``, ``power_control:``, ``ckpt_agent:``)
are kept as mappings here and validated by the service that owns them (``powerguard config
check`` validates each at once). Any other top-level key is refused by every service: a
typo (``coordinater:``) must never leave a service on its defaults.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from .errors import ConfigError, SecretNotFound
from .subjects import site_token, token

M = TypeVar("M", bound=BaseModel)


class SecretRef(BaseModel):
    """Where a credential lives: exactly one of ``env`` or ``file``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    env: str | None = None
    file: Path | None = None

    @model_validator(mode="after")
    def _one(self) -> SecretRef:
        if (self.env is None) == (self.file is None):
            raise ValueError("a secret reference needs exactly one of 'env' or 'file'")
        return self

    def resolve(self) -> SecretStr:
        if self.env is not None:
            value = os.environ.get(self.env)
            if value is None:
                raise SecretNotFound(f"environment variable {self.env} is not set")
            return SecretStr(value)
        assert self.file is not None
        from .file_modes import warn_if_exposed

        warn_if_exposed(self.file, "secret", logging.getLogger("powerguard.secrets"))
        try:
            return SecretStr(self.file.read_text().rstrip("\r\n"))
        except OSError as exc:
            raise SecretNotFound(f"cannot read secret file {self.file}: {exc.strerror}") from None

    def __str__(self) -> str:  # never the value
        return f"env:{self.env}" if self.env else f"file:{self.file}"


def secret_value(ref: SecretRef | None) -> str | None:
    """The secret behind ``ref`` (read now), or None when there is no reference."""
    return ref.resolve().get_secret_value() if ref is not None else None


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NatsSettings(_Model):
    url: str = "nats://127.0.0.1:4222"
    prefix: str = "pg"
    stream: str = "PG_EVENTS"
    jobs_stream: str | None = Field(
        default=None,
        description="The training jobs' stream (acks, registrations): default the events stream's "
        "name with JOBS for EVENTS (PG_JOBS)",
    )
    sagas_bucket: str = "pg_sagas"
    status_bucket: str = "pg_status"
    agents_bucket: str = "pg_agents"
    leases_bucket: str = "pg_leases"
    ups_bucket: str = "pg_ups"
    power_bucket: str = "pg_power"
    floors_bucket: str = "pg_floors"
    user: str | None = None
    password: SecretRef | None = None
    creds_file: Path | None = Field(default=None, description="NATS user credentials (JWT + nkey seed)")
    nkey_seed_file: Path | None = Field(default=None, description="An nkey seed (a config-file nkey user)")
    tls_ca: Path | None = Field(default=None, description="CA that signed the server's certificate")
    tls_cert: Path | None = Field(default=None, description="Client certificate (mutual TLS)")
    tls_key: Path | None = Field(default=None, description="Client certificate's key")


class UpsControl(_Model):
    """The credential power-control tells the UPS with to cut its output and return (the last
    step of an outage longer than the battery). NUT: ``username``/``password`` of a upsd user
    with ``instcmds = shutdown.return`` and ``instcmds = shutdown.stop`` in upsd.users. SNMP
    (UPS-MIB upsControl): ``options`` with write access, as a PDU's (``community``, or
    ``version: "3"`` with ``user``, ``auth_key``, ``priv_key``)."""

    username: SecretRef | None = None
    password: SecretRef | None = None
    options: dict[str, Any] = Field(default_factory=dict, description="SNMP write credentials")


class UpsConfig(_Model):
    name: str
    driver: Literal["snmp", "nut", "apcupsd"]
    host: str = "127.0.0.1"
    port: int | None = Field(default=None, ge=1, le=65535)
    options: dict[str, Any] = Field(default_factory=dict, description="Driver settings")
    capacity_wh: float | None = Field(
        default=None, gt=0, description="Battery energy at full charge, Wh: a runtime estimate of the coordinator's own"
    )
    rated_w: float | None = Field(default=None, gt=0, description="Rated output, W (the load % is a share of it)")
    control: UpsControl | None = Field(
        default=None,
        description="How power-control tells the UPS to cut its output and return (coordinator.ups_off); "
        "without it the UPS is never told",
    )

    _name = field_validator("name")(lambda v: token(v, what="ups"))


class OutletRef(_Model):
    pdu: str
    outlet: int = Field(ge=1)


class PduConfig(_Model):
    name: str
    driver: Literal["apc-snmp", "dry-run"] = "apc-snmp"
    host: str = "127.0.0.1"
    port: int = Field(default=161, ge=1, le=65535)
    options: dict[str, Any] = Field(default_factory=dict)

    _name = field_validator("name")(lambda v: token(v, what="pdu"))


class BmcConfig(_Model):
    driver: Literal["ipmi", "redfish", "dry-run"]
    host: str = "127.0.0.1"
    port: int | None = Field(default=None, ge=1, le=65535)
    username: SecretRef | None = None
    password: SecretRef | None = None
    options: dict[str, Any] = Field(default_factory=dict)


class NodeConfig(_Model):
    name: str
    feeds: list[str] = Field(min_length=1, description="UPSes feeding this node (A+B)")
    outlets: list[OutletRef] = Field(default_factory=list)
    bmc: BmcConfig | None = None
    power_on_group: int = Field(default=0, ge=0)
    role: Literal["compute", "storage", "network", "management"] = Field(
        default="compute",
        description="compute: runs jobs, checkpointed and shut down by the outage saga. storage, network: kept "
        "up for the checkpoints and shut down in the last stage of an outage longer than the battery (storage, "
        "then network) before the UPS is told to cut its output. management: PowerGuard's own hosts, shut down "
        "last, after the UPS was told (they go down within its delay)",
    )

    _name = field_validator("name")(lambda v: token(v, what="node"))


class ShutdownTimings(BaseModel):
    """The part of power-control's settings (``power_control:``) that bounds one node's shutdown.
    power-control's settings are built on it; the coordinator reads it from the same site file to
    know, before any outage was measured, how long a shutdown can take when the devices answer."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    soft_off_timeout_s: float = Field(default=120.0, gt=0, description="ACPI soft-off, then hard off")
    device_timeout_s: float = Field(default=10.0, gt=0, description="One request to one BMC or PDU")
    outlets_off_on_shutdown: bool = Field(default=False, description="Switch PDU outlets off after the node is off")
    job_stop_grace_s: float = Field(
        default=2.0, ge=0, description="A node's shutdown waits this long for its jobs' own stop command to arrive"
    )
    job_stop_wait_s: float = Field(
        default=60.0, ge=0, description="... and this long for that stop to finish; then it stops the jobs itself"
    )

    def bound_s(self, node: NodeConfig) -> float:
        """The longest power-control's shutdown of ``node`` takes while its devices answer: its
        jobs' stop (the grace, then the wait), the BMC's soft-off and its timeout, a hard off and
        its wait, then its outlets. A device that fails or times out takes longer (retries):
        that is what measured shutdowns and the reserve are for."""
        t = self.job_stop_grace_s + self.job_stop_wait_s
        if node.bmc is not None:  # status, soft-off, its wait, hard off, its wait
            t += self.soft_off_timeout_s + 4 * self.device_timeout_s
        if self.outlets_off_on_shutdown or node.bmc is None:
            t += len(node.outlets) * 3 * self.device_timeout_s  # each read, switched and read back
        return t


SERVICE_SECTIONS = ("coordinator", "ups_monitor", "power_control", "ckpt_agent")


class SiteConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    site: str
    nats: NatsSettings = Field(default_factory=NatsSettings)
    ups: list[UpsConfig] = Field(default_factory=list)
    pdus: list[PduConfig] = Field(default_factory=list)
    nodes: list[NodeConfig] = Field(default_factory=list)
    # each service's own settings, validated by the service (``settings``)
    coordinator: dict[str, Any] | None = None
    ups_monitor: dict[str, Any] | None = None
    power_control: dict[str, Any] | None = None
    ckpt_agent: dict[str, Any] | None = None  # what the site gives its jobs: the remote tier (url, S3 settings)

    _site = field_validator("site")(lambda v: site_token(v))

    @model_validator(mode="after")
    def _references(self) -> SiteConfig:
        for kind, names in (
            ("ups", [u.name for u in self.ups]),
            ("pdu", [p.name for p in self.pdus]),
            ("node", [n.name for n in self.nodes]),
        ):
            dupes = sorted({n for n in names if names.count(n) > 1})
            if dupes:
                raise ValueError(f"duplicate {kind} names: {', '.join(dupes)}")
        ups_names = {u.name for u in self.ups}
        pdu_names = {p.name for p in self.pdus}
        for node in self.nodes:
            for feed in node.feeds:
                if feed not in ups_names:
                    raise ValueError(f"node {node.name}: feed {feed!r} is not a configured UPS")
            for outlet in node.outlets:
                if outlet.pdu not in pdu_names:
                    raise ValueError(f"node {node.name}: outlet on unknown PDU {outlet.pdu!r}")
        return self

    def section(self, name: str) -> dict[str, Any]:
        """A service's own section (``coordinator:``, ...) or ``{}``."""
        if name not in SERVICE_SECTIONS:
            raise ConfigError(f"no service section {name!r} (the sections are {', '.join(SERVICE_SECTIONS)})")
        return getattr(self, name) or {}

    def settings(self, name: str, model: type[M]) -> M:
        """A service's section validated by its model; :class:`ConfigError` names every bad field."""
        try:
            return model.model_validate(self.section(name))
        except ValidationError as exc:
            errors = "; ".join(f"{name}.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:5])
            raise ConfigError(f"site {self.site}: {errors}") from None


def load_site(path: str | Path) -> SiteConfig:
    """Load and validate a site YAML file, with errors that name the file and field."""
    p = Path(path)
    try:
        raw = yaml.safe_load(p.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read site file {p}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{p}: the top level must be a mapping")
    unknown = [k for k in raw if k not in SiteConfig.model_fields]
    if unknown:
        raise ConfigError(f"{p}: invalid site file:\n  " + "\n  ".join(_unknown_key(str(k)) for k in unknown))
    try:
        return SiteConfig.model_validate(raw)
    except ValidationError as exc:
        lines = [f"{'.'.join(str(x) for x in e['loc']) or '<root>'}: {e['msg']}" for e in exc.errors()]
        raise ConfigError(f"{p}: invalid site file:\n  " + "\n  ".join(lines)) from None


def _unknown_key(key: str) -> str:
    import difflib

    known = list(SiteConfig.model_fields)
    near = difflib.get_close_matches(key, known, n=1)
    hint = f"; did you mean {near[0]!r}?" if near else f" (the top-level keys are {', '.join(known)})"
    return f"{key}: unknown top-level section{hint}"
