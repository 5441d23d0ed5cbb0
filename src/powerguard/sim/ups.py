"""A simulated UPS served over SNMP (RFC 1628 UPS-MIB and APC PowerNet) whose battery drains
with the load, as the APC Smart-UPS SRT 6000 measured in the original write-up: full-battery
runtime 9 min at 50 % load, 6 min at 75 %, 4 min at 100 %. ``speed`` makes the battery that
many times smaller (a demo cannot wait 6 minutes): it drains ``speed`` times faster and the
runtime it reports is the real time left at that drain, so what the UPS says and what the
coordinator measures of its discharge agree, as on a real UPS."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pysnmp.proto import rfc1902

from .snmp_agent import SnmpAgent

_CURVE = ((0.0, 1800.0), (25.0, 1080.0), (50.0, 540.0), (75.0, 360.0), (100.0, 240.0))  # load % -> runtime s


def full_runtime_s(load_pct: float) -> float:
    """Runtime of a full battery at this load (piecewise linear through the measured points)."""
    load = min(max(load_pct, 0.0), 100.0)
    for (l0, r0), (l1, r1) in itertools.pairwise(_CURVE):
        if load <= l1:
            return r0 + (r1 - r0) * (load - l0) / (l1 - l0)
    return _CURVE[-1][1]


@dataclass
class Battery:
    """Charge drains at 100 % per full runtime at the current load (times ``speed``) on battery,
    and recharges at ``recharge_pct_per_s`` (times ``speed``) on line."""

    load: Callable[[], float]
    speed: float = 1.0
    charge_pct: float = 100.0
    recharge_pct_per_s: float = 0.05
    low_battery_pct: float = 10.0
    on_battery: bool = False
    garbage: bool = False  # the agent reports out-of-range values (a fault drill)
    # a real UPS's runtime estimate jumps: (seconds on battery, runtime it reports from then on,
    # counting down), e.g. ((0, 600), (20, 100)); empty: the estimate follows the charge and load
    runtime_trace: tuple[tuple[float, float], ...] = ()
    load_jumps: tuple[tuple[float, float], ...] = ()  # (seconds on battery, load % added from then on)
    since: float = field(default_factory=time.monotonic)
    _t: float = field(default_factory=time.monotonic)

    def _advance(self) -> None:
        now = time.monotonic()
        dt = (now - self._t) * self.speed
        self._t = now
        if self.on_battery:
            self.charge_pct = max(0.0, self.charge_pct - 100.0 * dt / full_runtime_s(self.total_load()))
        else:
            self.charge_pct = min(100.0, self.charge_pct + self.recharge_pct_per_s * dt)

    def set_on_battery(self, on_battery: bool) -> None:
        self._advance()
        if on_battery != self.on_battery:
            self.on_battery, self.since = on_battery, time.monotonic()

    def _elapsed(self) -> float:
        return time.monotonic() - self.since if self.on_battery else 0.0

    def total_load(self) -> float:
        """The load of the powered nodes plus any load jump of this discharge."""
        t = self._elapsed()
        return self.load() + sum(extra for at, extra in self.load_jumps if self.on_battery and t >= at)

    @property
    def runtime_s(self) -> float:
        """The runtime the UPS reports: its trace where one is set (on battery), else the model's."""
        self._advance()
        t = self._elapsed()
        steps = [(at, r) for at, r in self.runtime_trace if self.on_battery and t >= at]
        if steps:
            at, reported = steps[-1]
            return max(0.0, reported - (t - at))
        return self.charge_pct / 100.0 * full_runtime_s(self.total_load()) / self.speed

    @property
    def low(self) -> bool:
        self._advance()
        return self.on_battery and self.charge_pct <= self.low_battery_pct

    @property
    def seconds_on_battery(self) -> int:
        return int(self._elapsed())


UPS_MIB = "1.3.6.1.2.1.33.1"
APC = "1.3.6.1.4.1.318.1.1.1"


def ups_agent(battery: Battery, *, community: str = "public", input_v: float = 230.0) -> SnmpAgent:
    """The UPS's SNMP agent: every value computed from ``battery`` when it is read."""
    a = SnmpAgent(community=community)
    b = battery
    integer, gauge, ticks = rfc1902.Integer32, rfc1902.Gauge32, rfc1902.TimeTicks
    # while ``garbage``: charge 255 % and load 999 % (a broken agent's out-of-range readings)

    def charge() -> int:
        return 255 if b.garbage else round(b.charge_pct)

    def load() -> int:
        return 999 if b.garbage else round(b.total_load())

    # RFC 1628 UPS-MIB
    a.scalar(f"{UPS_MIB}.2.1.0", integer, lambda: 3 if b.low else 2)  # upsBatteryStatus
    a.scalar(f"{UPS_MIB}.2.2.0", integer, lambda: b.seconds_on_battery)  # upsSecondsOnBattery
    a.scalar(f"{UPS_MIB}.2.3.0", integer, lambda: int(b.runtime_s // 60))  # upsEstimatedMinutesRemaining
    a.scalar(f"{UPS_MIB}.2.4.0", integer, charge)  # upsEstimatedChargeRemaining
    a.scalar(f"{UPS_MIB}.3.3.1.3.1", integer, lambda: 0 if b.on_battery else round(input_v))  # upsInputVoltage
    a.scalar(f"{UPS_MIB}.4.1.0", integer, lambda: 5 if b.on_battery else 3)  # upsOutputSource
    a.scalar(f"{UPS_MIB}.4.4.1.5.1", integer, load)  # upsOutputPercentLoad
    # APC PowerNet (runtime in TimeTicks: better than UPS-MIB's whole minutes)
    a.scalar(f"{APC}.2.1.1.0", integer, lambda: 3 if b.low else 2)  # upsBasicBatteryStatus
    a.scalar(f"{APC}.2.2.1.0", gauge, charge)  # upsAdvBatteryCapacity
    a.scalar(f"{APC}.2.2.3.0", ticks, lambda: int(b.runtime_s * 100))  # upsAdvBatteryRunTimeRemaining
    a.scalar(f"{APC}.3.2.1.0", gauge, lambda: 0 if b.on_battery else round(input_v))  # upsAdvInputLineVoltage
    a.scalar(f"{APC}.4.1.1.0", integer, lambda: 3 if b.on_battery else 2)  # upsBasicOutputStatus
    a.scalar(f"{APC}.4.2.3.0", gauge, load)  # upsAdvOutputLoad
    return a
