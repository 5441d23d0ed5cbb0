"""IPMI 2.0 (RMCP+) BMCs through pyghmi.

pyghmi is blocking with its own I/O thread, so every call runs in a daemon thread of its own
(``in_daemon_thread``: a hung pyghmi call never holds up the event loop's or the process's exit).
Credentials are passed as bytes (with str, a second ``Command`` for the same BMC hangs),
and pyghmi's errors are turned into ones that say what happened: an unreachable BMC
raises ``IpmiException('None')`` after ~5.5 s, which becomes :class:`DeviceUnreachable`.
"""

from __future__ import annotations

import threading
from typing import Any

from ..errors import AuthenticationFailed, CommandRejected, DeviceUnreachable, PowerControlError
from .base import Guarded, PowerDriver, PowerState, RestorePolicy, Slot, in_daemon_thread, sleep_until

# IPMI chassis status byte 1 bits 5-6 / Set Power Restore Policy (netfn 0, cmd 6)
_POLICY_CODES: dict[RestorePolicy, int] = {"always-off": 0, "previous": 1, "always-on": 2}
_POLICY_NAMES = {v: k for k, v in _POLICY_CODES.items()}
_AUTH_HINTS = ("password", "unauthorized name", "unauthorized role", "insufficient privilege", "invalid username")


SESSION_AHEAD_S = 5.0  # how long before a ramp slot the IPMI session is opened


_PATCH = threading.Lock()
_patched = False


def _one_pyghmi_lock() -> None:
    """pyghmi (1.6) takes its two module locks in opposite orders: ``wait_for_rsp`` holds
    WAITING_SESSIONS and retransmits a timed-out request through ``send_payload``, which takes
    KEEPALIVE_SESSIONS; ``send_payload`` holds KEEPALIVE_SESSIONS and takes WAITING_SESSIONS in
    ``_xmit_packet``. Two threads met there (a stack dump of the hang showed exactly that), and
    from then on every IPMI call of the process hung: power-control lost all its BMCs. One
    reentrant lock for both names removes the cycle. Also creates the class's login lock once
    (pyghmi creates it on first use, racily, so two logins could get two locks)."""
    global _patched
    if _patched:  # once per process: every command calls this, the lock is for the first time only
        return
    with _PATCH:
        if _patched:
            return
        from pyghmi.ipmi.private import session

        session.WAITING_SESSIONS = session.KEEPALIVE_SESSIONS
        if session.Session.socketchecking is None:
            session.Session.socketchecking = threading.Lock()
        _patched = True


def _wrap(device: str, exc: BaseException) -> PowerControlError:
    text = str(exc).strip()
    low = text.lower()
    if any(h in low for h in _AUTH_HINTS):
        return AuthenticationFailed(f"{device}: BMC refused the credentials ({text})")
    if text in ("", "None") or "timeout" in low or "timed out" in low or "unreachable" in low:
        return DeviceUnreachable(f"{device}: no IPMI answer from the BMC (is it powered and on the network?)")
    if "invalid" in low or "not supported" in low or "unknown" in low:
        return CommandRejected(f"{device}: BMC rejected the command ({text})")
    return PowerControlError(f"{device}: IPMI error: {text}")


class IpmiDriver(PowerDriver):
    kind = "ipmi"

    def __init__(
        self,
        device: str,
        guard: Guarded,
        *,
        host: str,
        port: int = 623,
        user: str,
        password: str,
        kg: str | None = None,
    ) -> None:
        super().__init__(device, guard)
        self.host, self.port = host, port
        self._user, self._password = user.encode(), password.encode()
        self._kg = kg.encode() if kg else None

    def __repr__(self) -> str:  # never the credentials
        return f"IpmiDriver({self.device} {self.host}:{self.port})"

    def _command(self) -> Any:
        _one_pyghmi_lock()
        from pyghmi.ipmi import command  # imported late: pyghmi starts an I/O thread on import

        return command.Command(
            bmc=self.host, userid=self._user, password=self._password, port=self.port, kg=self._kg, keepalive=False
        )

    async def _run(self, what: str, fn, session: Any = None) -> Any:
        def blocking() -> Any:
            try:
                return fn(session if session is not None else self._command())
            except PowerControlError:
                raise
            except Exception as exc:  # pyghmi raises IpmiException and plain exceptions alike
                raise _wrap(self.device, exc) from None

        return await self.guard.call(what, lambda: in_daemon_thread(blocking, name=f"ipmi {self.device}"))

    async def status(self) -> PowerState:
        rsp = await self._run("get power", lambda c: c.get_power())
        state = rsp.get("powerstate")
        return state if state in ("on", "off") else "unknown"

    async def _set(self, state: str, session: Any = None) -> None:
        rsp = await self._run(f"set power {state}", lambda c: c.set_power(state, wait=False), session)
        if "error" in rsp:
            raise _wrap(self.device, Exception(rsp["error"]))

    async def on(self) -> None:
        await self._set("on")

    async def on_at(self, slot: Slot) -> None:
        """The RMCP+ session (channel auth, open session, RAKP 1-4) is set up before the ramp's
        slot, at most SESSION_AHEAD_S before it (a BMC drops an idle session after a while);
        at the slot only the one Chassis Control request goes out. Setting the session up at
        the slot put two BMCs' power-ons 0.2 s apart instead of 1 s under CPU load."""
        await sleep_until(slot.start - SESSION_AHEAD_S)
        session = await self._run("open session", lambda c: c)
        await slot.wait()
        await self._set("on", session)

    async def soft_off(self) -> None:
        await self._set("shutdown")

    async def off(self) -> None:
        await self._set("off")

    async def cycle(self) -> None:
        await self._set("boot")  # on when off, reset when on

    async def restore_policy(self) -> RestorePolicy | None:
        rsp = await self._run("get chassis status", lambda c: c.raw_command(netfn=0, command=1))
        if "error" in rsp:
            raise _wrap(self.device, Exception(rsp["error"]))
        code = (rsp["data"][0] >> 5) & 0b11
        return _POLICY_NAMES.get(code)

    async def set_restore_policy(self, policy: RestorePolicy) -> None:
        code = _POLICY_CODES[policy]
        rsp = await self._run("set power restore policy", lambda c: c.raw_command(netfn=0, command=6, data=[code]))
        if "error" in rsp:
            raise CommandRejected(f"{self.device}: BMC refused the power-restore policy {policy}: {rsp['error']}")
