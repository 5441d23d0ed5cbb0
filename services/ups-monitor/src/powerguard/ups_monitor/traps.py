"""SNMP trap receiver (pysnmp NotificationReceiver on asyncio, v2c and v3): a trap from a UPS
triggers an immediate poll of it, so detection does not wait for the next poll."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from pysnmp.carrier.asyncio.dgram import udp
from pysnmp.entity import config
from pysnmp.entity.engine import SnmpEngine
from pysnmp.entity.rfc3413 import ntfrcv
from pysnmp.proto.rfc1902 import OctetString

log = logging.getLogger(__name__)

SNMP_TRAP_OID = "1.3.6.1.6.3.1.1.4.1.0"
UPS_ALARM_LOW_BATTERY = "1.3.6.1.2.1.33.1.6.3.3"
# trap OID -> what it says
KNOWN = {
    "1.3.6.1.2.1.33.2.1": "on_battery",  # upsTrapOnBattery
    "1.3.6.1.2.1.33.2.3": "alarm_added",  # upsTrapAlarmEntryAdded (low battery: upsAlarmLowBattery)
    "1.3.6.1.2.1.33.2.4": "alarm_removed",  # upsTrapAlarmEntryRemoved
    "1.3.6.1.4.1.318.0.5": "on_battery",  # APC upsOnBattery
    "1.3.6.1.4.1.318.0.9": "on_line",  # APC powerRestored
    "1.3.6.1.4.1.318.0.7": "low_battery",  # APC lowBattery
}


@dataclass(frozen=True)
class Trap:
    source: str  # sender's IP address
    trap_oid: str
    meaning: str  # on_battery, on_line, low_battery, alarm_added, alarm_removed, other
    values: dict[str, str]


@dataclass(frozen=True)
class V3TrapUser:
    user: str
    auth_key: str
    priv_key: str
    engine_id: str  # the sender's snmpEngineID, hex


class TrapReceiver:
    def __init__(
        self,
        *,
        host: str,
        port: int,
        community: str | None = None,
        v3_users: list[V3TrapUser] | None = None,
        on_trap: Callable[[Trap], None],
    ) -> None:
        self.host, self.port, self.community = host, port, community
        self.v3_users = v3_users or []
        self.on_trap = on_trap
        self.engine: SnmpEngine | None = None
        self._transport = None

    async def start(self) -> None:
        engine = SnmpEngine()
        transport = udp.UdpAsyncioTransport().open_server_mode((self.host, self.port))
        await transport._lport  # a taken port must fail here, not silently later
        self._transport = transport
        config.add_transport(engine, udp.DOMAIN_NAME, transport)
        if self.community:
            config.add_v1_system(engine, "pg-trap-area", self.community)
        for u in self.v3_users:
            config.add_v3_user(
                engine,
                u.user,
                config.USM_AUTH_HMAC96_SHA,
                u.auth_key,
                config.USM_PRIV_CFB128_AES,
                u.priv_key,
                securityEngineId=OctetString(hexValue=u.engine_id),
            )
        ntfrcv.NotificationReceiver(engine, self._received)
        self.engine = engine
        log.info("listening for SNMP traps on udp:%s:%d", self.host, self.port)

    def _received(self, engine, state_reference, context_engine_id, context_name, var_binds, cb_ctx) -> None:
        try:
            _, address = engine.message_dispatcher.get_transport_info(state_reference)
            values = {str(name): val.prettyPrint() for name, val in var_binds}
            trap_oid = values.get(SNMP_TRAP_OID, "")
            meaning = KNOWN.get(trap_oid, "other")
            if meaning == "alarm_added" and UPS_ALARM_LOW_BATTERY in values.values():
                meaning = "low_battery"
            self.on_trap(Trap(source=address[0], trap_oid=trap_oid, meaning=meaning, values=values))
        except Exception:  # never let a bad trap break the receiver
            log.exception("could not handle a trap")

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close_transport()
            self._transport = None
