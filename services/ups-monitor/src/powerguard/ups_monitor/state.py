"""The per-UPS state machine (pure): readings, failures and a clock in; power events out.

Transitions: on_battery / on_line, low_battery, fsd, replace_battery, overload (rising edges),
comm_lost after ``comm_timeout_s`` without a good reading (never read as 'on battery'),
comm_restored, and ``status`` telemetry every ``status_every_s``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from .reading import Reading

Kind = Literal[
    "on_battery", "on_line", "low_battery", "fsd", "replace_battery", "overload", "comm_lost", "comm_restored", "status"
]
POWER_KINDS = ("on_battery", "on_line", "low_battery", "fsd", "replace_battery", "overload")
EDGES = (
    ("low_battery", "low_battery"),
    ("fsd", "fsd"),
    ("replace_battery", "replace_battery"),
    ("overload", "overload"),
)


@dataclass(frozen=True)
class Transition:
    kind: Kind
    reading: Reading | None
    reason: str | None = None


@dataclass
class UpsState:
    comm_timeout_s: float = 10.0
    status_every_s: float = 30.0
    reading: Reading | None = None  # last good reading
    last_good_at: float | None = None
    comm_lost: bool = False
    last_status_at: float | None = None
    last_error: str | None = None
    started_at: float | None = None
    _seen: dict[str, bool] = field(default_factory=dict)

    def good(self, reading: Reading, now: float) -> list[Transition]:
        out: list[Transition] = []
        if self.comm_lost:
            self.comm_lost = False
            out.append(Transition("comm_restored", reading, "good reading again"))
        prev = self.reading
        was_on_battery = prev.on_battery if prev else False
        if reading.on_battery != was_on_battery:
            out.append(Transition("on_battery" if reading.on_battery else "on_line", reading))
        for attr, kind in EDGES:
            if getattr(reading, attr) and not (getattr(prev, attr) if prev else False):
                out.append(Transition(kind, reading))  # type: ignore[arg-type]
        self.reading, self.last_good_at, self.last_error = reading, now, None
        if self.last_status_at is None or now - self.last_status_at >= self.status_every_s or out:
            self.last_status_at = now
            out.append(Transition("status", reading))
        return out

    def failed(self, error: str, now: float) -> list[Transition]:
        self.last_error = error
        if self.started_at is None:
            self.started_at = now
        since = self.last_good_at if self.last_good_at is not None else self.started_at
        if not self.comm_lost and now - since >= self.comm_timeout_s:
            self.comm_lost = True
            return [Transition("comm_lost", self.reading, error)]
        return []
