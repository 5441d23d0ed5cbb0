"""A simulated APC switched rack PDU over SNMP: rPDUOutletControlOutletCommand.<n> (1 on,
2 off, 3 reboot; write community only) and rPDUOutletStatusOutletState.<n> (1 on, 2 off).
Every switch is time-stamped in ``log`` (the demo shows the inrush stagger from it)."""

from __future__ import annotations

import time
from collections.abc import Callable

from pysnmp.proto import rfc1902

from .snmp_agent import SnmpAgent

CONTROL = "1.3.6.1.4.1.318.1.1.12.3.3.1.1.4"
STATUS = "1.3.6.1.4.1.318.1.1.12.3.5.1.1.4"


class SimPdu:
    def __init__(self, outlets: int, *, on_change: Callable[[int, bool], None] | None = None) -> None:
        self.state = dict.fromkeys(range(1, outlets + 1), True)
        self.log: list[tuple[float, int, bool]] = []
        self.on_change = on_change

    def switch(self, outlet: int, on: bool) -> None:
        if self.state[outlet] != on:
            self.state[outlet] = on
            self.log.append((time.time(), outlet, on))
            if self.on_change:
                self.on_change(outlet, on)

    def agent(self, *, community: str = "public", write_community: str = "private") -> SnmpAgent:
        a = SnmpAgent(community=community, write_community=write_community)
        for n in self.state:
            a.scalar(f"{STATUS}.{n}", rfc1902.Integer32, lambda n=n: 1 if self.state[n] else 2)

            def command(value: int, dry: bool, n: int = n) -> bool:
                if value not in (1, 2, 3):
                    return False
                if not dry:
                    self.switch(n, value != 2)
                return True

            a.scalar(f"{CONTROL}.{n}", rfc1902.Integer32, lambda n=n: 1 if self.state[n] else 2, set=command)
        return a
