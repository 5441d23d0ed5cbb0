"""Power events from ups-monitor: ``pg.power.<site>.<ups>``."""

from __future__ import annotations

from typing import Literal

from pydantic import AwareDatetime, Field

from .envelope import Data, Envelope, utcnow
from .subjects import Subjects


class PowerData(Data):
    """One normalized UPS reading and what it means."""

    site: str = Field(description="Site name from the site YAML")
    ups: str = Field(description="UPS name from the site YAML")
    on_battery: bool = Field(description="True when the load runs from the battery")
    status: list[str] = Field(default_factory=list, description="NUT-style status flags, e.g. ['OB', 'DISCHRG', 'LB']")
    charge_pct: float | None = Field(default=None, ge=0, le=100, description="Battery charge %")
    runtime_s: float | None = Field(default=None, ge=0, description="Estimated runtime left, seconds")
    load_pct: float | None = Field(default=None, ge=0, description="Output load %")
    input_v: float | None = Field(default=None, ge=0, description="Input (utility) voltage, V")
    seconds_on_battery: float | None = Field(default=None, ge=0)
    driver: str | None = Field(default=None, description="snmp, nut, apcupsd, trap")
    via: Literal["poll", "trap"] | None = Field(default=None, description="How the change was seen")
    partial: bool = Field(default=False, description="Some values could not be read")
    reason: str | None = Field(default=None, description="Human-readable cause (comm_lost etc.)")
    observed_at: AwareDatetime = Field(default_factory=utcnow, description="When the reading was taken")
    drill: bool = Field(
        default=False, description="Synthetic, from `powerguard drill`: the saga's power and job commands are dry-run"
    )


class PowerEvent(Envelope):
    data: PowerData
    SUBJECT_TEMPLATE = "{prefix}.power.{site}.{ups}"  # a drill's: {prefix}.drill.power.{site}.{ups}

    def nats_subject(self, subjects: Subjects) -> str:
        """A drill's reading has its own subject, which only the operator may publish on: the
        ``drill`` field is bound to the subject like the type is (:func:`check_subject`), so who
        may say "drill" or "real" is decided by the server, not by the payload."""
        if self.data.drill:
            return subjects.drill_power(self.data.site, self.data.ups)
        return subjects.power(self.data.site, self.data.ups)


class OnBattery(PowerEvent):
    """Utility power failed: the UPS carries the load on battery."""

    type: Literal["io.powerguard.power.v1.on_battery"] = "io.powerguard.power.v1.on_battery"


class OnLine(PowerEvent):
    """Utility power is back: the UPS runs on line."""

    type: Literal["io.powerguard.power.v1.on_line"] = "io.powerguard.power.v1.on_line"


class LowBattery(PowerEvent):
    """The UPS reports low battery: shut down now."""

    type: Literal["io.powerguard.power.v1.low_battery"] = "io.powerguard.power.v1.low_battery"


class CommLost(PowerEvent):
    """No good reading for ``comm_timeout_s``. Never means 'on battery'."""

    type: Literal["io.powerguard.power.v1.comm_lost"] = "io.powerguard.power.v1.comm_lost"


class CommRestored(PowerEvent):
    """Good readings again after :class:`CommLost`."""

    type: Literal["io.powerguard.power.v1.comm_restored"] = "io.powerguard.power.v1.comm_restored"


class PowerStatus(PowerEvent):
    """Periodic telemetry (every ``status_every_s``)."""

    type: Literal["io.powerguard.power.v1.status"] = "io.powerguard.power.v1.status"


class ReplaceBattery(PowerEvent):
    """The UPS asks for a battery replacement."""

    type: Literal["io.powerguard.power.v1.replace_battery"] = "io.powerguard.power.v1.replace_battery"


class Overload(PowerEvent):
    """The UPS output is overloaded."""

    type: Literal["io.powerguard.power.v1.overload"] = "io.powerguard.power.v1.overload"


class ForcedShutdown(PowerEvent):
    """The UPS (or its primary) ordered a forced shutdown (NUT FSD)."""

    type: Literal["io.powerguard.power.v1.fsd"] = "io.powerguard.power.v1.fsd"


POWER_EVENTS: tuple[type[PowerEvent], ...] = (
    OnBattery,
    OnLine,
    LowBattery,
    CommLost,
    CommRestored,
    PowerStatus,
    ReplaceBattery,
    Overload,
    ForcedShutdown,
)
