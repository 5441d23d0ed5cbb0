"""A UPS's output over SNMP: the last step of an outage longer than the battery, for a UPS
whose network card speaks SNMP (pysnmp 7, asyncio; v2c with the write community, or v3
authPriv, as for the PDUs). ``profile`` as ups-monitor's: ``ups-mib``, ``apc`` or ``auto``
(UPS-MIB where the agent has its upsControl group, else APC PowerNet).

RFC 1628 UPS-MIB: one SET of ``upsAutoRestart`` = on(1) (the output comes back when mains
returns) and ``upsShutdownAfterDelay`` = delay (the output goes off that many seconds later),
then a GET of ``upsShutdownAfterDelay``: a count-down (≥ 0) is the UPS's own word that the
shutdown is pending. ``cancel()``: ``upsShutdownAfterDelay`` = -1.

APC PowerNet: ``upsAdvConfigShutoffDelay`` = delay, then ``upsBasicControlConserveBattery`` =
turnOffUpsToConserveBattery(2): a UPS on battery goes to sleep after the delay and turns on
again when utility power returns (the agent refuses it on line). A read-only community
(noAccess, notWritable) is :class:`CommandRejected` naming the write credential.
"""

from __future__ import annotations

from typing import Any

from pysnmp.hlapi.v3arch.asyncio import ContextData, ObjectIdentity, ObjectType, UdpTransportTarget, get_cmd, set_cmd
from pysnmp.proto.rfc1902 import Integer, TimeTicks

from powerguard.snmp import engine

from ..errors import CommandRejected
from .base import Guarded
from .snmp_errors import raise_for

UPS_SHUTDOWN_AFTER_DELAY = "1.3.6.1.2.1.33.1.8.2.0"
UPS_AUTO_RESTART = "1.3.6.1.2.1.33.1.8.5.0"  # on(1), off(2)
APC_CONSERVE_BATTERY = "1.3.6.1.4.1.318.1.1.1.6.1.1.0"  # upsBasicControlConserveBattery: turnOffUps...(2)
APC_SHUTOFF_DELAY = "1.3.6.1.4.1.318.1.1.1.5.2.10.0"  # upsAdvConfigShutoffDelay, TimeTicks


class UpsMibOutput:
    kind = "snmp"

    def __init__(
        self, device: str, guard: Guarded, *, host: str, port: int = 161, auth: Any, profile: str = "auto"
    ) -> None:
        """``auth``: pysnmp's CommunityData/UsmUserData with write access (``powerguard.snmp.auth_data``)."""
        if profile not in ("auto", "ups-mib", "apc"):
            raise CommandRejected(f"{device}: unknown SNMP profile {profile!r} (auto, ups-mib or apc)")
        self.device, self.guard = device, guard
        self.host, self.port = host, port
        self._auth = auth
        self.profile = profile

    def __repr__(self) -> str:
        return f"UpsMibOutput({self.device} {self.host}:{self.port})"

    async def shutdown_return(self, delay_s: float | None = None) -> str:
        delay = max(0, round(delay_s if delay_s is not None else 0))

        async def go() -> str:
            if self.profile == "apc" or (self.profile == "auto" and not await self._has(UPS_SHUTDOWN_AFTER_DELAY)):
                return await self._apc(delay)
            await self._set(
                "SET upsAutoRestart on, upsShutdownAfterDelay",
                (UPS_AUTO_RESTART, 1),
                (UPS_SHUTDOWN_AFTER_DELAY, delay),
            )
            left = await self._get_int("GET upsShutdownAfterDelay", UPS_SHUTDOWN_AFTER_DELAY)
            if left < 0:
                raise CommandRejected(f"{self.device}: the UPS took the SET but reports no pending shutdown ({left})")
            return f"upsShutdownAfterDelay counting down ({left} s left), upsAutoRestart on (UPS-MIB)"

        return await self.guard.call("upsShutdownAfterDelay", go)

    async def _apc(self, delay: int) -> str:
        await self._set("SET upsAdvConfigShutoffDelay", (APC_SHUTOFF_DELAY, delay * 100), ticks=True)
        await self._set("SET upsBasicControlConserveBattery turnOffUpsToConserveBattery", (APC_CONSERVE_BATTERY, 2))
        return f"upsBasicControlConserveBattery set: asleep in {delay} s, on again when mains returns (APC PowerNet)"

    async def _has(self, oid: str) -> bool:
        try:
            await self._get_int(f"GET {oid}", oid)
            return True
        except CommandRejected:
            return False

    async def cancel(self) -> str:
        async def go() -> str:
            await self._set("SET upsShutdownAfterDelay -1", (UPS_SHUTDOWN_AFTER_DELAY, -1))
            return "pending shutdown cancelled (upsShutdownAfterDelay -1)"

        return await self.guard.call("upsShutdownAfterDelay -1", go)

    async def _target(self) -> UdpTransportTarget:
        return await UdpTransportTarget.create(
            (self.host, self.port), timeout=min(2.0, self.guard.timeout_s), retries=1
        )

    async def _set(self, what: str, *values: tuple[str, int], ticks: bool = False) -> None:
        kind = TimeTicks if ticks else Integer
        binds = [ObjectType(ObjectIdentity(oid), kind(v)) for oid, v in values]
        ei, es, _, _ = await set_cmd(engine(), self._auth, await self._target(), ContextData(), *binds)
        self._check(what, ei, es)

    async def _get_int(self, what: str, oid: str) -> int:
        ei, es, _, binds = await get_cmd(
            engine(), self._auth, await self._target(), ContextData(), ObjectType(ObjectIdentity(oid))
        )
        self._check(what, ei, es)
        try:
            return int(binds[0][1])
        except (TypeError, ValueError):
            raise CommandRejected(f"{self.device}: the UPS has no {oid} ({binds[0][1].prettyPrint()})") from None

    def _check(self, what: str, err_ind: Any, err_status: Any) -> None:
        raise_for(
            self.device,
            f"{self.host}:{self.port}",
            what,
            err_ind,
            err_status,
            refused_hint="ups[].control.options needs its write community or a v3 user with write access",
        )
