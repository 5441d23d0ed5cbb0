"""How long a UPS's battery lasts: not one reading's word for it (pure, no I/O).

A UPS reports its own runtime estimate, and that estimate jumps between readings (the load
changes, the estimate moves in steps) and is optimistic on an aged battery. Beside it the saga
keeps two estimates of its own and uses the most conservative of the three:

* **discharge**: the charge the battery lost over the recent readings on battery, as a rate at
  the load it was drawn at, scaled to the current load: ``charge / rate``;
* **capacity**: where the site file gives the battery's energy (``capacity_wh``) and the UPS's
  rated output (``rated_w``), the energy left at the current load:
  ``capacity_wh * charge% / (rated_w * load%)``.

Every function takes the readings it needs and returns a number; the saga decides with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

SAMPLES = 16  # readings kept per UPS while on battery (t, charge %, load % or -1)
WINDOW_S = 180.0  # the discharge rate is measured over the readings of the last WINDOW_S
MIN_SPAN_S = 10.0  # ... spanning at least this long
MIN_DROP_PCT = 1.0  # ... and at least this much charge (a UPS reports whole percent)


@dataclass(frozen=True)
class Estimate:
    runtime_s: float | None  # the most conservative runtime known (None: nothing to go on)
    source: str | None  # reported | discharge | capacity
    reported_s: float | None = None
    discharge_s: float | None = None
    capacity_s: float | None = None


def add_sample(samples: list[list[float]], t: float, charge_pct: float | None, load_pct: float | None) -> None:
    """Keep a reading of the charge (in place, bounded): one sample per change of charge or load."""
    if charge_pct is None:
        return
    load = -1.0 if load_pct is None else float(load_pct)
    if samples and samples[-1][1] == charge_pct and samples[-1][2] == load:
        return  # the same reading again: the first time it was seen is the one that dates it
    samples.append([float(t), float(charge_pct), load])
    del samples[:-SAMPLES]


def discharge_rate(samples: Sequence[Sequence[float]]) -> tuple[float, float] | None:
    """(%/s, mean load % or -1) over the recent samples, or None when they span too little."""
    if len(samples) < 2:
        return None
    last = samples[-1]
    window = [s for s in samples if last[0] - s[0] <= WINDOW_S]
    first = window[0]
    span, drop = last[0] - first[0], first[1] - last[1]
    if span < MIN_SPAN_S or drop < MIN_DROP_PCT:
        return None
    loads = [s[2] for s in window if s[2] >= 0]
    return drop / span, (sum(loads) / len(loads) if len(loads) == len(window) else -1.0)


def discharge_runtime(samples: Sequence[Sequence[float]], load_pct: float | None) -> float | None:
    """Seconds to empty at the measured discharge, scaled to the current load where both are known."""
    rate = discharge_rate(samples)
    if rate is None:
        return None
    per_s, at_load = rate
    if load_pct is not None and at_load > 0 and load_pct > 0:
        per_s *= load_pct / at_load
    return samples[-1][1] / per_s


def capacity_runtime(
    charge_pct: float | None, load_pct: float | None, capacity: tuple[float, float] | None
) -> float | None:
    """Seconds of energy left from the site file's battery capacity at the current load."""
    if capacity is None or charge_pct is None or not load_pct:
        return None
    wh, rated_w = capacity
    watts = rated_w * load_pct / 100.0
    return wh * 3600.0 * (charge_pct / 100.0) / watts if watts > 0 else None


def estimate(
    *,
    reported_s: float | None,
    samples: Sequence[Sequence[float]],
    charge_pct: float | None,
    load_pct: float | None,
    capacity: tuple[float, float] | None = None,
) -> Estimate:
    """The most conservative of the UPS's reported runtime, the discharge and the capacity."""
    dis = discharge_runtime(samples, load_pct)
    cap = capacity_runtime(charge_pct, load_pct, capacity)
    known = [
        (v, name) for v, name in ((reported_s, "reported"), (dis, "discharge"), (cap, "capacity")) if v is not None
    ]
    if not known:
        return Estimate(None, None)
    value, source = min(known)
    return Estimate(value, source, reported_s, dis, cap)


def observed_runtime(samples: Sequence[Sequence[float]], start_charge_pct: float | None) -> float | None:
    """What the battery would have lasted from the outage's start at the load observed: the
    full outage's discharge rate applied to the charge it started with (the figure a UPS's
    first runtime estimate is judged against)."""
    if start_charge_pct is None or len(samples) < 2:
        return None
    first, last = samples[0], samples[-1]
    span, drop = last[0] - first[0], first[1] - last[1]
    if span < MIN_SPAN_S or drop < MIN_DROP_PCT:
        return None
    return start_charge_pct / (drop / span)
