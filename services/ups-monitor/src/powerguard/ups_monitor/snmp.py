"""SNMP driver (pysnmp 7, asyncio): RFC 1628 UPS-MIB and APC PowerNet-MIB, SNMPv2c and
SNMPv3 authPriv. One SnmpEngine per process (its first request costs ~0.6 s)."""

from __future__ import annotations

from typing import Any, Literal

from pysnmp.hlapi.v3arch.asyncio import (
    ContextData,
    ObjectIdentity,
    ObjectType,
    SnmpEngine,
    UdpTransportTarget,
    UsmUserData,
    get_cmd,
)
from pysnmp.proto.rfc1902 import Counter32, Gauge32, Integer, TimeTicks, Unsigned32

from powerguard.snmp import classify, engine

from .nut import UpsError, UpsUnreachable
from .reading import Reading

SYS_OBJECT_ID = "1.3.6.1.2.1.1.2.0"
APC_ENTERPRISE = "1.3.6.1.4.1.318"
Profile = Literal["ups-mib", "apc"]

# name -> OID, per profile
PROFILES: dict[str, dict[str, str]] = {
    "ups-mib": {
        "source": "1.3.6.1.2.1.33.1.4.1.0",  # upsOutputSource: 3 normal, 5 battery
        "battery_status": "1.3.6.1.2.1.33.1.2.1.0",  # upsBatteryStatus: 2 normal, 3 low, 4 depleted
        "seconds_on_battery": "1.3.6.1.2.1.33.1.2.2.0",
        "minutes_remaining": "1.3.6.1.2.1.33.1.2.3.0",
        "charge": "1.3.6.1.2.1.33.1.2.4.0",
        "load": "1.3.6.1.2.1.33.1.4.4.1.5.1",
        "input_v": "1.3.6.1.2.1.33.1.3.3.1.3.1",
    },
    "apc": {
        "source": "1.3.6.1.4.1.318.1.1.1.4.1.1.0",  # upsBasicOutputStatus: 2 onLine, 3 onBattery
        "battery_status": "1.3.6.1.4.1.318.1.1.1.2.1.1.0",  # upsBasicBatteryStatus: 2 normal, 3 low
        "runtime_ticks": "1.3.6.1.4.1.318.1.1.1.2.2.3.0",  # upsAdvBatteryRunTimeRemaining (TimeTicks)
        "charge": "1.3.6.1.4.1.318.1.1.1.2.2.1.0",  # upsAdvBatteryCapacity
        "load": "1.3.6.1.4.1.318.1.1.1.4.2.3.0",  # upsAdvOutputLoad
        "input_v": "1.3.6.1.4.1.318.1.1.1.3.2.1.0",  # upsAdvInputLineVoltage
    },
}
_NUMERIC = (Integer, TimeTicks, Gauge32, Unsigned32, Counter32)


class SnmpAuthError(UpsError):
    """The agent rejected our SNMPv3 credentials (or community)."""


class SnmpDriver:
    def __init__(
        self,
        *,
        name: str,
        host: str,
        port: int | None,
        auth: Any,
        profile: str = "auto",
        timeout: float = 1.0,
        retries: int = 0,
    ) -> None:
        self.name, self.host, self.port = name, host, port or 161
        self.auth, self.profile, self.timeout, self.retries = auth, profile, timeout, retries
        self._target: UdpTransportTarget | None = None
        # SNMPv3 keeps per-agent state (engine id, boots, time) in the engine; an agent that was
        # restarted or re-keyed can stay unreachable through it, so a v3 UPS gets an engine of its
        # own, rebuilt after repeated failures.
        self._own_engine = isinstance(auth, UsmUserData)
        self._engine: SnmpEngine | None = None
        self._failures = 0

    async def _get(self, oids: list[str]) -> dict[str, Any]:
        if self._target is None:
            self._target = await UdpTransportTarget.create(
                (self.host, self.port), timeout=self.timeout, retries=self.retries
            )
        if self._own_engine and self._engine is None:
            self._engine = SnmpEngine()
        error_indication, error_status, error_index, var_binds = await get_cmd(
            self._engine or engine(),
            self.auth,
            self._target,
            ContextData(),
            *[ObjectType(ObjectIdentity(o)) for o in oids],
        )
        if error_indication and self._own_engine:
            self._failures += 1
            if self._failures >= 3:  # start afresh: discovery, engine id, boots, time
                self._engine, self._target, self._failures = None, None, 0
        elif not error_indication:
            self._failures = 0
        if error_indication:
            text = str(error_indication)
            if classify(error_indication) == "auth":
                raise SnmpAuthError(
                    f"ups {self.name}: SNMP authentication failed (check the SNMPv3 user and keys): {text}"
                )
            raise UpsUnreachable(f"ups {self.name}: no SNMP answer from {self.host}:{self.port}: {text}")
        if error_status:
            raise UpsError(
                f"ups {self.name}: agent error {error_status.prettyPrint()} at "
                f"{oids[int(error_index) - 1] if error_index else '?'}"
            )
        return {str(oid): value for oid, value in var_binds}

    async def _resolve_profile(self) -> str:
        if self.profile != "auto":
            return self.profile
        sys_oid = str((await self._get([SYS_OBJECT_ID]))[SYS_OBJECT_ID])
        self.profile = "apc" if sys_oid.startswith(APC_ENTERPRISE) else "ups-mib"
        return self.profile

    async def poll(self) -> Reading:
        profile = await self._resolve_profile()
        oids = PROFILES[profile]
        raw = await self._get(list(oids.values()))
        values: dict[str, float] = {}
        errors: list[str] = []
        for name, oid in oids.items():
            v = raw.get(oid)
            if isinstance(v, _NUMERIC):
                values[name] = float(int(v))
            else:
                errors.append(f"{name} ({oid}): {type(v).__name__ if v is not None else 'missing'}")
        if "source" not in values:
            raise UpsError(f"ups {self.name}: output source unreadable ({'; '.join(errors)})")
        if profile == "ups-mib":
            on_battery = values["source"] == 5
            runtime = values["minutes_remaining"] * 60 if "minutes_remaining" in values else None
        else:
            on_battery = values["source"] == 3
            runtime = values["runtime_ticks"] / 100 if "runtime_ticks" in values else None
        low = values.get("battery_status") in (3.0, 4.0)
        status = ("OB", "DISCHRG") if on_battery else ("OL",)
        return Reading(
            on_battery=on_battery,
            low_battery=low,
            status=status + (("LB",) if low else ()),
            charge_pct=values.get("charge"),
            runtime_s=runtime,
            load_pct=values.get("load"),
            input_v=values.get("input_v"),
            seconds_on_battery=values.get("seconds_on_battery"),
            partial=bool(errors),
            errors=tuple(errors),
        )

    async def close(self) -> None:
        self._target = None
