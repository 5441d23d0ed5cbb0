"""SNMP plumbing shared by ups-monitor and power-control (pysnmp 7, asyncio)."""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pysnmp.hlapi.v3arch.asyncio import (
    CommunityData,
    SnmpEngine,
    UsmUserData,
    usmAesCfb128Protocol,
    usmAesCfb256Protocol,
    usmHMAC192SHA256AuthProtocol,
    usmHMACSHAAuthProtocol,
)

from powerguard.schemas import SecretRef, secret_value

__all__ = ["AUTH_PROTOCOLS", "PRIV_PROTOCOLS", "SnmpCredentials", "auth_data", "classify", "engine"]

AUTH_PROTOCOLS = {"SHA": usmHMACSHAAuthProtocol, "SHA256": usmHMAC192SHA256AuthProtocol}
PRIV_PROTOCOLS = {"AES": usmAesCfb128Protocol, "AES256": usmAesCfb256Protocol}
_engines: dict[int, SnmpEngine] = {}


class SnmpCredentials(BaseModel):
    """SNMP v2c (``community``) or v3 authPriv (``user``, ``auth_key``, ``priv_key``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: Literal["2c", "3"] = "2c"
    community: SecretRef | None = Field(default=None, description="v2c community")
    user: str | None = Field(default=None, description="v3 USM user")
    auth_key: SecretRef | None = Field(default=None, description="v3 authentication key")
    priv_key: SecretRef | None = Field(default=None, description="v3 privacy (encryption) key")
    auth_protocol: Literal["SHA", "SHA256"] = "SHA"
    priv_protocol: Literal["AES", "AES256"] = "AES"

    @model_validator(mode="after")
    def _v3_is_auth_priv(self) -> SnmpCredentials:
        if self.version == "3":
            missing = [f for f in ("user", "auth_key", "priv_key") if getattr(self, f) is None]
            if missing:
                raise ValueError(f"SNMPv3 is used with authPriv only: set {', '.join(missing)}")
        return self


def auth_data(creds: SnmpCredentials, *, default_community: str | None = None) -> Any:
    """pysnmp's authentication object for ``creds`` (secrets are read now). A v2c device with
    no community gets ``default_community``; none at all is a ValueError."""
    if creds.version == "3":
        return UsmUserData(
            creds.user,
            secret_value(creds.auth_key),
            secret_value(creds.priv_key),
            authProtocol=AUTH_PROTOCOLS[creds.auth_protocol],
            privProtocol=PRIV_PROTOCOLS[creds.priv_protocol],
        )
    community = secret_value(creds.community) or default_community
    if not community:
        raise ValueError("SNMP v2c needs options.community")
    return CommunityData(community, mpModel=1)


def engine() -> SnmpEngine:
    """The process's SnmpEngine for the running event loop (an old loop's is dropped)."""
    loop = asyncio.get_running_loop()
    if id(loop) not in _engines:
        _engines.clear()
        _engines[id(loop)] = SnmpEngine()
    return _engines[id(loop)]


_AUTH_SIGNS = ("digest", "unknownusm", "unknownusername", "decrypt", "unsupportedsecuritylevel", "authorization")


def classify(error_indication: Any) -> Literal["timeout", "auth", "other"]:
    """What a pysnmp error indication means: no answer, refused credentials, or anything else."""
    text = str(error_indication).lower()
    if "timeout" in text or "no snmp response" in text:
        return "timeout"
    if any(s in text.replace(" ", "") for s in _AUTH_SIGNS):
        return "auth"
    return "other"
