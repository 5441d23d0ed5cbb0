"""What an SNMP answer's error means for a power-control driver (the PDUs' and the UPS-MIB
output's): one mapping to the error classes, each message naming the device."""

from __future__ import annotations

from typing import Any

from powerguard.snmp import classify

from ..errors import AuthenticationFailed, CommandRejected, DeviceUnreachable, PowerControlError

REFUSALS = ("noAccess", "notWritable", "authorizationError", "readOnly", "noCreation", "inconsistentName")


def raise_for(device: str, target: str, what: str, err_ind: Any, err_status: Any, *, refused_hint: str) -> None:
    """Raise for an SNMP error indication or error status (nothing when there is none).
    ``target`` is host:port; ``refused_hint`` says which credential a refusal points at."""
    if err_ind:
        text, kind = str(err_ind), classify(err_ind)
        if kind == "timeout":
            raise DeviceUnreachable(f"{device}: no SNMP answer from {target} to {what}")
        if kind == "auth":
            raise AuthenticationFailed(f"{device}: SNMPv3 credentials refused ({text})")
        raise PowerControlError(f"{device}: SNMP {what} failed: {text}")
    if err_status:
        status = err_status.prettyPrint()
        if status in REFUSALS:
            raise CommandRejected(f"{device}: agent refused {what}: {status} ({refused_hint})")
        raise CommandRejected(f"{device}: agent answered {status} to {what}")
