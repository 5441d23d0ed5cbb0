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
    fsd: bool = False  # the UPS (or its primary) orders a forced shutdown (NUT's FSD flag)
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


@dataclass
class Output:
    """The UPS's output, as UPS-MIB's upsControl group drives it: ``upsShutdownAfterDelay``
    turns it off that many seconds later (-1 cancels a pending shutdown); with
    ``upsAutoRestart`` on it comes back ``startup_delay_s`` after mains returns (else it stays
    off). ``mains`` says whether utility power is there now. Every change is in ``log``."""

    mains: Callable[[], bool]
    auto_restart: bool = False
    startup_delay_s: float = 0.3
    on: bool = True
    shutdown_at: float | None = None
    _mains_since: float | None = None
    log: list[tuple[float, str]] = field(default_factory=list)

    def _advance(self) -> None:
        now = time.monotonic()
        if self.shutdown_at is not None and now >= self.shutdown_at:
            self.shutdown_at, self.on = None, False
            self.log.append((now, "output off"))
        mains = self.mains()
        if not mains:
            self._mains_since = None
        elif self._mains_since is None:
            self._mains_since = now
        if (
            not self.on
            and self.auto_restart
            and mains
            and now - max(self._mains_since or now, self._off_at()) >= self.startup_delay_s
        ):
            self.on = True
            self.log.append((now, "output on"))

    def _off_at(self) -> float:
        return next((t for t, what in reversed(self.log) if what == "output off"), 0.0)

    def shutdown_after(self, delay_s: int) -> None:
        self._advance()
        now = time.monotonic()
        self.shutdown_at = None if delay_s < 0 else now + delay_s
        self.log.append((now, f"shutdown after {delay_s}" if delay_s >= 0 else "shutdown cancelled"))

    def set_auto_restart(self, on: bool) -> None:
        self.auto_restart = on
        self.log.append((time.monotonic(), f"auto restart {'on' if on else 'off'}"))

    def is_on(self) -> bool:
        self._advance()
        return self.on

    def seconds_to_shutdown(self) -> int:
        self._advance()
        return -1 if self.shutdown_at is None else max(0, round(self.shutdown_at - time.monotonic()))

    def events(self, what: str) -> list[float]:
        self._advance()
        return [t for t, w in self.log if w == what]


UPS_MIB = "1.3.6.1.2.1.33.1"
APC = "1.3.6.1.4.1.318.1.1.1"


def ups_agent(
    battery: Battery,
    *,
    community: str = "public",
    input_v: float = 230.0,
    output: Output | None = None,
    write_community: str | None = None,
) -> SnmpAgent:
    """The UPS's SNMP agent: every value computed from ``battery`` when it is read. With
    ``output`` and a ``write_community``, UPS-MIB's upsControl group drives the output (the last
    step of an outage longer than the battery)."""
    a = SnmpAgent(community=community, write_community=write_community if output is not None else None)
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
    out_on = output.is_on if output is not None else (lambda: True)
    a.scalar(f"{UPS_MIB}.4.1.0", integer, lambda: 2 if not out_on() else 5 if b.on_battery else 3)  # upsOutputSource
    a.scalar(f"{UPS_MIB}.4.4.1.5.1", integer, load)  # upsOutputPercentLoad
    if output is not None:  # upsControl: upsShutdownAfterDelay (-1 cancels), upsAutoRestart on(1)/off(2)
        o = output
        a.scalar(
            f"{UPS_MIB}.8.2.0",
            integer,
            o.seconds_to_shutdown,
            set=lambda v, dry: v >= -1 and (dry or o.shutdown_after(v) or True),
        )
        a.scalar(
            f"{UPS_MIB}.8.5.0",
            integer,
            lambda: 1 if o.auto_restart else 2,
            set=lambda v, dry: v in (1, 2) and (dry or o.set_auto_restart(v == 1) or True),
        )
    if output is not None:  # APC PowerNet: upsAdvConfigShutoffDelay, upsBasicControlConserveBattery (on battery only)
        delay = {"ticks": 2000}
        a.scalar(
            f"{APC}.5.2.10.0",
            ticks,
            lambda: delay["ticks"],
            set=lambda v, dry: v >= 0 and (dry or not delay.update(ticks=v)),
        )

        def conserve(v: int, dry: bool) -> bool:
            if v != 2 or not b.on_battery:
                return v == 1  # noTurnOffUps is accepted and does nothing; sleeping on line is refused
            if not dry:
                output.set_auto_restart(True)
                output.shutdown_after(round(delay["ticks"] / 100))
            return True

        a.scalar(f"{APC}.6.1.1.0", integer, lambda: 1, set=conserve)
    # APC PowerNet (runtime in TimeTicks: better than UPS-MIB's whole minutes)
    a.scalar(f"{APC}.2.1.1.0", integer, lambda: 3 if b.low else 2)  # upsBasicBatteryStatus
    a.scalar(f"{APC}.2.2.1.0", gauge, charge)  # upsAdvBatteryCapacity
    a.scalar(f"{APC}.2.2.3.0", ticks, lambda: int(b.runtime_s * 100))  # upsAdvBatteryRunTimeRemaining
    a.scalar(f"{APC}.3.2.1.0", gauge, lambda: 0 if b.on_battery else round(input_v))  # upsAdvInputLineVoltage
    a.scalar(f"{APC}.4.1.1.0", integer, lambda: 3 if b.on_battery else 2)  # upsBasicOutputStatus
    a.scalar(f"{APC}.4.2.3.0", gauge, load)  # upsAdvOutputLoad
    return a
