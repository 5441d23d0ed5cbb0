"""The one async interface every power device speaks, with the guards they all share:
a concurrency bound per driver kind, one request at a time per device (a BMC has few session
slots: an off and an on of one node overlapping confused one), a timeout per request, and a
refusal of our credentials doubted once, then believed and held off (no retry storm against a
BMC that would lock us out: ``retry_policy.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from typing import Literal, Protocol, TypeVar

from ..errors import AuthenticationFailed, CredentialsDoubted, DeviceUnreachable, PowerControlError
from ..retry_policy import CredentialWatch

PowerState = Literal["on", "off", "unknown"]
RestorePolicy = Literal["always-on", "previous", "always-off"]
T = TypeVar("T")


class Slot(Protocol):
    """A node's place in the power-on ramp (power-control's sequences hand one to ``on_at``)."""

    start: float  # the planned start, time.monotonic()

    async def wait(self) -> None:
        """Return when the command may go out (and count it as started)."""
        ...


class Guarded:
    """Timeout, concurrency slot, one request at a time, and the credential watch around every
    request to one device."""

    def __init__(
        self, device: str, *, timeout_s: float, slots: asyncio.Semaphore | None = None, auth_holdoff_s: float = 300.0
    ) -> None:
        self.device = device
        self.timeout_s = timeout_s
        self.slots = slots
        self.auth_holdoff_s = auth_holdoff_s
        self.credentials = CredentialWatch(auth_holdoff_s)
        self.serial = asyncio.Lock()  # one request (or session) to this device at a time

    async def call(self, what: str, fn: Callable[[], Awaitable[T]], *, locked: bool = False) -> T:
        """Run one request; ``locked``: the caller holds :attr:`serial` already (a session it keeps
        open across requests)."""
        why = self.credentials.blocked(time.monotonic())
        if why is not None:
            raise AuthenticationFailed(
                f"{self.device}: {why} (not retried for {self.auth_holdoff_s:.0f}s after a credential failure)"
            )
        async with contextlib.nullcontext() if locked else self.serial, self.slots or _NO_LIMIT:
            try:
                result = await asyncio.wait_for(fn(), self.timeout_s)
            except AuthenticationFailed as exc:
                text = str(exc).removeprefix(f"{self.device}: ")
                if self.credentials.refused(time.monotonic(), text):
                    raise
                raise CredentialsDoubted(
                    f"{self.device}: {text} once: tried again on a fresh session before it counts"
                ) from None
            except PowerControlError as exc:
                if not isinstance(exc, DeviceUnreachable):
                    self.credentials.answered()  # it answered: the credentials were taken
                raise
            except TimeoutError:
                raise DeviceUnreachable(f"{self.device}: no answer to {what} within {self.timeout_s:.1f}s") from None
        self.credentials.answered()
        return result


async def in_daemon_thread(fn: Callable[[], T], *, name: str) -> T:
    """Run a blocking device call in a daemon thread of its own. A call that hangs (a BMC
    library stuck in its own retries) is abandoned at the caller's timeout, and nothing waits
    for it afterwards: ``asyncio.to_thread``'s executor is joined when the event loop shuts down
    and when the process exits, so one hung BMC call would hang power-control's stop."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, exc: BaseException | None) -> None:
        if done.done():
            return  # the caller gave up (timeout, cancel)
        if exc is not None:
            done.set_exception(exc)
        else:
            done.set_result(result)  # type: ignore[arg-type]

    def run() -> None:
        try:
            result, exc = fn(), None
        except BaseException as e:  # handed to the caller, whatever it is
            result, exc = None, e
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody is waiting
            loop.call_soon_threadsafe(settle, result, exc)

    threading.Thread(target=run, name=name, daemon=True).start()
    return await done


_TIMER_SLACK_S = 0.0015


async def sleep_until(start: float) -> None:
    """Sleep until ``time.monotonic()`` reaches ``start`` (no wait when it has), on time: the
    event loop's timers fire up to a millisecond late (epoll's timeout is whole milliseconds,
    rounded up), which at a ramp of 100 nodes/s is 5-10 % of every slot; so the last
    ``_TIMER_SLACK_S`` is spent yielding to the loop (other tasks run) until the time has come."""
    loop = asyncio.get_running_loop()  # its clock is time.monotonic() (virtual in the runner's tests)
    wait = start - loop.time()
    if wait > _TIMER_SLACK_S:
        await asyncio.sleep(wait - _TIMER_SLACK_S)
    while loop.time() < start:  # noqa: ASYNC110 (a spin that yields; no event marks the time)
        await asyncio.sleep(0)


class _NoLimit:
    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, *exc: object) -> None:
        return None


_NO_LIMIT = _NoLimit()


class PowerDriver(ABC):
    """A node's BMC: power state read-back and power actions."""

    kind: str = "?"

    def __init__(self, device: str, guard: Guarded) -> None:
        self.device = device  # "bmc:<node>", used in events and errors
        self.guard = guard

    @abstractmethod
    async def status(self) -> PowerState: ...

    @abstractmethod
    async def on(self) -> None: ...

    async def on_at(self, slot: Slot) -> None:
        """Power on in the power-on ramp's ``slot``: the command goes out once ``slot.wait()``
        returns, not earlier. A driver whose command needs setup first (an IPMI session: several
        round trips, slow and uneven under load) does that before, from ``slot.start`` on, so
        nodes reach their BMCs as far apart as the ramp spaces them. This default waits, then
        calls :meth:`on`."""
        await slot.wait()
        await self.on()

    @abstractmethod
    async def soft_off(self) -> None:
        """ACPI shutdown request: the OS shuts down cleanly (or ignores it)."""

    @abstractmethod
    async def off(self) -> None:
        """Immediate power off."""

    @abstractmethod
    async def cycle(self) -> None: ...

    async def restore_policy(self) -> RestorePolicy | None:
        """What the BMC does when AC power returns; None when it does not say."""
        return None

    async def set_restore_policy(self, policy: RestorePolicy) -> None:
        raise PowerControlError(f"{self.device}: setting the power-restore policy is not supported by {self.kind}")

    async def close(self) -> None:
        return None


class OutletDriver(ABC):
    """A switched PDU: outlets on and off, state read-back."""

    kind: str = "?"

    def __init__(self, device: str, guard: Guarded) -> None:
        self.device = device  # "pdu:<name>"
        self.guard = guard

    @abstractmethod
    async def outlet_state(self, outlet: int) -> PowerState: ...

    @abstractmethod
    async def set_outlet(self, outlet: int, on: bool) -> None: ...

    async def close(self) -> None:
        return None
