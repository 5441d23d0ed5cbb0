"""The runner's device steps: a call retried by the retry policy, a wait for a power state
bounded by the step's wait, an outlet switched and read back, outlet-ons spaced by the stagger.
Every wait is on the runner's clock (clock.py); every device call has its driver's timeout."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from . import clock
from .config import PowerControlSettings
from .drivers import Devices, PowerDriver, PowerState
from .errors import PowerControlError, PowerStateTimeout
from .ramp_wait import RampSlot
from .retry_policy import after_failure
from .step_report import Order, StepReport

log = logging.getLogger("powerguard.power_control.sequences")
T = TypeVar("T")
CONFIRM_REFUSAL_S = 1.0  # a refused credential is tried again on a fresh session this soon (retry_policy.py)


class DeviceSteps:
    def __init__(self, devices: Devices, settings: PowerControlSettings, report: StepReport) -> None:
        self.devices, self.s, self.report = devices, settings, report
        self._outlet_lock = asyncio.Lock()
        self._last_outlet_on = -1e9

    async def retrying(self, what: str, fn: Callable[[], Awaitable[T]]) -> T:
        attempt = 0
        while True:
            try:
                return await fn()
            except PowerControlError as exc:
                retry = after_failure(
                    exc, attempt, retries=self.s.retries, backoff_s=self.s.retry_backoff_s, confirm_s=CONFIRM_REFUSAL_S
                )
                if not retry.again:
                    raise
                attempt += 1
                log.info("%s failed (%s); retry %d/%d in %.1fs", what, exc, attempt, self.s.retries, retry.delay_s)
                await asyncio.sleep(retry.delay_s)

    async def wait_state(self, bmc: PowerDriver, want: PowerState, timeout_s: float) -> bool:
        deadline = clock.now() + timeout_s
        while True:
            try:
                if await bmc.status() == want:
                    return True
            except PowerControlError as exc:
                if not exc.retryable:
                    raise
                log.debug("%s: status read failed while waiting for %s: %s", bmc.device, want, exc)
            left = deadline - clock.now()
            if left <= 0:
                return False
            await asyncio.sleep(min(self.s.poll_interval_s, left))

    def ref(self, node: str, device: str):
        return next(r for r in self.devices.node(node).outlets if f"pdu:{r.pdu}:{r.outlet}" == device)

    async def outlets(self, o: Order, *, on: bool, slot: RampSlot | None = None) -> bool:
        """Switch the node's outlets in order; with a ramp ``slot``, the first switch waits for it."""
        for ref in self.devices.node(o.node).outlets:
            if not await self.outlet(o, ref, on=on, slot=slot):
                return False
            slot = None
        return True

    async def outlet(self, o: Order, ref, *, on: bool, slot: RampSlot | None = None) -> bool:
        """Switch one outlet (the ramp ``slot`` first, when given) and read it back."""
        action = "outlet_on" if on else "outlet_off"
        t = clock.now()
        device = f"pdu:{ref.pdu}:{ref.outlet}"
        try:
            pdu = self.devices.pdu(ref.pdu)
            if await self.retrying(f"{device} state", lambda: pdu.outlet_state(ref.outlet)) == ("on" if on else "off"):
                await self.report.done(o, action, device, t, detail="already " + ("on" if on else "off"))
                return True
            if on:
                if slot is not None:
                    await slot.wait()
                await self._stagger()
                t = clock.now()
            await self.retrying(f"{device} switch", lambda: pdu.set_outlet(ref.outlet, on))
            state = await pdu.outlet_state(ref.outlet)
            if state != ("on" if on else "off"):
                raise PowerStateTimeout(f"{device}: reads {state} after switching it {'on' if on else 'off'}")
            await self.report.done(o, action, device, t, detail=f"outlet {state}")
        except PowerControlError as exc:
            await self.report.failed(o, action, device, t, str(exc))
            return False
        return True

    async def _stagger(self) -> None:
        """Outlet-on actions of the whole site are at least ``outlet_stagger_s`` apart."""
        async with self._outlet_lock:
            wait = self._last_outlet_on + self.s.outlet_stagger_s - clock.now()
            if wait > 0:
                await asyncio.sleep(wait)
            self._last_outlet_on = clock.now()
