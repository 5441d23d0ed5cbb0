"""A normalized UPS reading, whatever the driver, and NUT-style status flags."""

from __future__ import annotations

from dataclasses import dataclass, field


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
