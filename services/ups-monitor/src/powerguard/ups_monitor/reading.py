"""A normalized UPS reading, whatever the driver, and NUT-style status flags."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

# what a value can physically be; anything else is a broken agent, not a measurement
RANGES = {
    "charge_pct": (0.0, 100.0),
    "runtime_s": (0.0, 7 * 24 * 3600.0),
    "load_pct": (0.0, 400.0),
    "input_v": (0.0, 1000.0),
    "seconds_on_battery": (0.0, 365 * 24 * 3600.0),
}


@dataclass(frozen=True)
class Reading:
    """What one poll saw. ``partial`` when some values could not be read (``errors`` says which)."""

    on_battery: bool
    low_battery: bool = False
    fsd: bool = False
    replace_battery: bool = False
    overload: bool = False
    status: tuple[str, ...] = ()
    charge_pct: float | None = None
    runtime_s: float | None = None
    load_pct: float | None = None
    input_v: float | None = None
    seconds_on_battery: float | None = None
    partial: bool = False
    errors: tuple[str, ...] = field(default=())

    def checked(self) -> Reading:
        """This reading with every out-of-range or non-finite value dropped (and named in
        ``errors``, ``partial``): one UPS reporting charge 255 or a NaN runtime is a partial
        reading of that UPS, never an exception that stops the monitor."""
        bad = {}
        for name, (lo, hi) in RANGES.items():
            v = getattr(self, name)
            if v is None:
                continue
            try:
                ok = math.isfinite(float(v)) and lo <= float(v) <= hi
            except (TypeError, ValueError):
                ok = False
            if not ok:
                bad[name] = v
        if not bad:
            return self
        errors = tuple(f"{k} {v!r} out of range" for k, v in bad.items())
        return replace(self, **dict.fromkeys(bad), partial=True, errors=self.errors + errors)

    @classmethod
    def from_status(cls, status: str, **values) -> Reading:
        """From a NUT ``ups.status`` (``"OB DISCHRG LB"``): OL, OB, LB, RB, FSD, OVER, BYPASS, CHRG, DISCHRG."""
        flags = tuple(status.split())
        return cls(
            on_battery="OB" in flags,
            low_battery="LB" in flags,
            fsd="FSD" in flags,
            replace_battery="RB" in flags,
            overload="OVER" in flags,
            status=flags,
            **values,
        )
