"""The simulated site's errors (one root: PowerGuardError)."""

from __future__ import annotations

from powerguard.schemas.errors import PowerGuardError


class DrillError(PowerGuardError):
    """The drill could not finish: names the step that did not happen in time."""
