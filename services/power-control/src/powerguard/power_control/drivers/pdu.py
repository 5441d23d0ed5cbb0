"""APC PowerNet switched rack PDUs (rPDU) over SNMP v2c or v3 (pysnmp 7, asyncio).

rPDUOutletControlOutletCommand.<n> (1 on, 2 off, 3 reboot) switches an outlet;
rPDUOutletStatusOutletState.<n> (1 on, 2 off) reads it back. Agent errors (noAccess from a
read-only community, notWritable, wrongValue) become :class:`CommandRejected`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pysnmp.hlapi.v3arch.asyncio import (
    CommunityData,
    ContextData,
    ObjectIdentity,
    ObjectType,
    SnmpEngine,
    UdpTransportTarget,
    UsmUserData,
    get_cmd,
    set_cmd,
    usmAesCfb128Protocol,
    usmAesCfb256Protocol,
    usmHMAC192SHA256AuthProtocol,
    usmHMACSHAAuthProtocol,
)
from pysnmp.proto.rfc1902 import Integer

from ..errors import AuthenticationFailed, CommandRejected, DeviceUnreachable, PowerControlError
from .base import Guarded, OutletDriver, PowerState

OUTLET_COMMAND = "1.3.6.1.4.1.318.1.1.12.3.3.1.1.4"  # .<n>: 1 immediateOn, 2 immediateOff, 3 immediateReboot
OUTLET_STATE = "1.3.6.1.4.1.318.1.1.12.3.5.1.1.4"  # .<n>: 1 outletStatusOn, 2 outletStatusOff
_AUTH = {"SHA": usmHMACSHAAuthProtocol, "SHA256": usmHMAC192SHA256AuthProtocol}
_PRIV = {"AES": usmAesCfb128Protocol, "AES256": usmAesCfb256Protocol}
_REFUSALS = ("noAccess", "notWritable", "authorizationError", "readOnly", "noCreation", "inconsistentName")
_engines: dict[int, SnmpEngine] = {}


def _engine() -> SnmpEngine:
    """One SnmpEngine per event loop (its first request costs ~0.6 s; transports belong to a loop)."""
    loop = asyncio.get_running_loop()
    if id(loop) not in _engines:
        _engines.clear()
        _engines[id(loop)] = SnmpEngine()
    return _engines[id(loop)]


class ApcPduDriver(OutletDriver):
    kind = "pdu"

    def __init__(
        self,
        device: str,
        guard: Guarded,
        *,
        host: str,
        port: int = 161,
        version: str = "2c",
        community: str | None = None,
        user: str | None = None,
        auth_key: str | None = None,
        priv_key: str | None = None,
        auth_protocol: str = "SHA",
        priv_protocol: str = "AES",
    ) -> None:
        super().__init__(device, guard)
        self.host, self.port = host, port
        if version == "3":
            if not user:
                raise PowerControlError(f"{device}: SNMPv3 needs options.user")
            self._auth: Any = UsmUserData(
                user,
                authKey=auth_key,
                privKey=priv_key,
                authProtocol=_AUTH[auth_protocol] if auth_key else None,
                privProtocol=_PRIV[priv_protocol] if priv_key else None,
            )
        else:
            if not community:
                raise PowerControlError(
                    f"{device}: SNMP v2c needs options.community (the PDU's write community; no 'private' default)"
                )
            self._auth = CommunityData(community, mpModel=1)

    def __repr__(self) -> str:
        return f"ApcPduDriver({self.device} {self.host}:{self.port})"

    async def _target(self) -> UdpTransportTarget:
        return await UdpTransportTarget.create(
            (self.host, self.port), timeout=min(2.0, self.guard.timeout_s), retries=1
        )

    def _check(self, what: str, err_ind: Any, err_status: Any, err_index: Any) -> None:
        if err_ind:
            text = str(err_ind)
            if "timeout" in text.lower() or "no snmp response" in text.lower():
                raise DeviceUnreachable(f"{self.device}: no SNMP answer from {self.host}:{self.port} to {what}")
            if "unknownusername" in text.lower().replace(" ", "") or "wrongdigest" in text.lower().replace(" ", ""):
                raise AuthenticationFailed(f"{self.device}: SNMPv3 credentials refused ({text})")
            raise PowerControlError(f"{self.device}: SNMP {what} failed: {text}")
        if err_status:
            status = err_status.prettyPrint()
            if status in _REFUSALS:
                raise CommandRejected(f"{self.device}: agent refused {what}: {status} (check the write community/user)")
            raise CommandRejected(f"{self.device}: agent answered {status} to {what}")

    async def outlet_state(self, outlet: int) -> PowerState:
        async def go() -> PowerState:
            oid = f"{OUTLET_STATE}.{outlet}"
            ei, es, ex, binds = await get_cmd(
                _engine(), self._auth, await self._target(), ContextData(), ObjectType(ObjectIdentity(oid))
            )
            self._check(f"GET outlet {outlet}", ei, es, ex)
            value = binds[0][1]
            try:
                code = int(value)
            except (TypeError, ValueError):
                raise CommandRejected(
                    f"{self.device}: outlet {outlet} does not exist ({value.prettyPrint()})"
                ) from None
            return {1: "on", 2: "off"}.get(code, "unknown")

        return await self.guard.call(f"GET outlet {outlet}", go)

    async def set_outlet(self, outlet: int, on: bool) -> None:
        async def go() -> None:
            oid = f"{OUTLET_COMMAND}.{outlet}"
            ei, es, ex, _ = await set_cmd(
                _engine(),
                self._auth,
                await self._target(),
                ContextData(),
                ObjectType(ObjectIdentity(oid), Integer(1 if on else 2)),
            )
            self._check(f"SET outlet {outlet} {'on' if on else 'off'}", ei, es, ex)

        await self.guard.call(f"SET outlet {outlet}", go)
