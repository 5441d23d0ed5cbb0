"""APC PowerNet switched rack PDUs (rPDU) over SNMP v2c or v3 (pysnmp 7, asyncio).

rPDUOutletControlOutletCommand.<n> (1 on, 2 off, 3 reboot) switches an outlet;
rPDUOutletStatusOutletState.<n> (1 on, 2 off) reads it back. Agent errors (noAccess from a
read-only community, notWritable, wrongValue) become :class:`CommandRejected`.
"""

from __future__ import annotations

from typing import Any

from pysnmp.hlapi.v3arch.asyncio import ContextData, ObjectIdentity, ObjectType, UdpTransportTarget, get_cmd, set_cmd
from pysnmp.proto.rfc1902 import Integer

from powerguard.snmp import engine

from ..errors import CommandRejected
from .base import Guarded, OutletDriver, PowerState
from .snmp_errors import raise_for

OUTLET_COMMAND = "1.3.6.1.4.1.318.1.1.12.3.3.1.1.4"  # .<n>: 1 immediateOn, 2 immediateOff, 3 immediateReboot
OUTLET_STATE = "1.3.6.1.4.1.318.1.1.12.3.5.1.1.4"  # .<n>: 1 outletStatusOn, 2 outletStatusOff


class ApcPduDriver(OutletDriver):
    kind = "pdu"

    def __init__(
        self,
        device: str,
        guard: Guarded,
        *,
        host: str,
        port: int = 161,
        auth: Any,
    ) -> None:
        """``auth``: pysnmp's CommunityData/UsmUserData (``powerguard.snmp.auth_data``)."""
        super().__init__(device, guard)
        self.host, self.port = host, port
        self._auth = auth

    def __repr__(self) -> str:
        return f"ApcPduDriver({self.device} {self.host}:{self.port})"

    async def _target(self) -> UdpTransportTarget:
        return await UdpTransportTarget.create(
            (self.host, self.port), timeout=min(2.0, self.guard.timeout_s), retries=1
        )

    def _check(self, what: str, err_ind: Any, err_status: Any, err_index: Any) -> None:
        raise_for(
            self.device,
            f"{self.host}:{self.port}",
            what,
            err_ind,
            err_status,
            refused_hint="check the write community/user",
        )

    async def outlet_state(self, outlet: int) -> PowerState:
        async def go() -> PowerState:
            oid = f"{OUTLET_STATE}.{outlet}"
            ei, es, ex, binds = await get_cmd(
                engine(), self._auth, await self._target(), ContextData(), ObjectType(ObjectIdentity(oid))
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
                engine(),
                self._auth,
                await self._target(),
                ContextData(),
                ObjectType(ObjectIdentity(oid), Integer(1 if on else 2)),
            )
            self._check(f"SET outlet {outlet} {'on' if on else 'off'}", ei, es, ex)

        await self.guard.call(f"SET outlet {outlet}", go)
