"""Dry-run devices: log and report what would be done, keep a pretend state, touch nothing."""

from __future__ import annotations

import logging

from .base import Guarded, OutletDriver, PowerDriver, PowerState, RestorePolicy

log = logging.getLogger(__name__)


class DryRunPower(PowerDriver):
    kind = "dry-run"

    def __init__(self, device: str, guard: Guarded, *, initial: PowerState = "on") -> None:
        super().__init__(device, guard)
        self.state: PowerState = initial
        self.policy: RestorePolicy | None = None

    async def status(self) -> PowerState:
        return self.state

    async def _would(self, action: str, state: PowerState) -> None:
        log.info("dry-run: would %s %s", action, self.device)
        self.state = state

    async def on(self) -> None:
        await self._would("power on", "on")

    async def soft_off(self) -> None:
        await self._would("soft-off (ACPI)", "off")

    async def off(self) -> None:
        await self._would("power off", "off")

    async def cycle(self) -> None:
        await self._would("power cycle", "on")

    async def restore_policy(self) -> RestorePolicy | None:
        return self.policy

    async def set_restore_policy(self, policy: RestorePolicy) -> None:
        log.info("dry-run: would set the power-restore policy of %s to %s", self.device, policy)
        self.policy = policy


class DryRunOutlets(OutletDriver):
    kind = "dry-run"

    def __init__(self, device: str, guard: Guarded) -> None:
        super().__init__(device, guard)
        self.states: dict[int, PowerState] = {}

    async def outlet_state(self, outlet: int) -> PowerState:
        return self.states.get(outlet, "on")

    async def set_outlet(self, outlet: int, on: bool) -> None:
        log.info("dry-run: would switch %s outlet %d %s", self.device, outlet, "on" if on else "off")
        self.states[outlet] = "on" if on else "off"
