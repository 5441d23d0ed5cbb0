"""IPMI 2.0 (RMCP+) BMCs through ``ipmitool -I lanplus``, one process per request.

The default IPMI transport. Every request is its own ``ipmitool`` process with its own socket
and session, so nothing is shared between BMCs: a dead BMC's retransmissions cannot delay a
healthy one's answer (with pyghmi, every BMC of the process shares one I/O loop and its locks;
measured in bench/bmc_isolation.py: a healthy BMC's power-on 33-45 s in 2 of 5 runs with two
dead peers). A request that runs past the device timeout is killed with its process group.

The password reaches ipmitool in its environment (``-E``: ``IPMI_PASSWORD``), K_g likewise
(``-K``: ``IPMI_KGKEY``), never on the command line where ``ps`` shows it. ``-v`` makes
ipmitool say why a session failed, which tells a refused credential ("RAKP 2 HMAC is invalid",
"unauthorized name") from a BMC that does not answer.

A power-on in the ramp (``on_at``) opens its session ahead of the slot: ``ipmitool shell``
sets the RMCP+ session up when it starts, and at the slot only the one Chassis Control request
goes out (several round trips of session setup at the slot, slow and uneven under load, would
put two BMCs' power-ons closer than the ramp spaces them).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal

from ..errors import AuthenticationFailed, CommandRejected, DeviceUnreachable, PowerControlError
from .base import Guarded, PowerDriver, PowerState, RestorePolicy, Slot, sleep_until

_POLICY_NAMES = {0: "always-off", 1: "previous", 2: "always-on"}
_AUTH_HINTS = ("hmac is invalid", "unauthorized name", "unauthorized role", "insufficient privilege", "invalid user")
_UNREACHABLE_HINTS = ("unable to establish", "no response", "timeout", "timed out", "connection refused")
_STATUS = re.compile(r"chassis power is (on|off)", re.IGNORECASE)
_POWERED_ON = re.compile(r"chassis power control: up/on", re.IGNORECASE)
_END = "--powerguard-end--"
SESSION_AHEAD_S = 5.0  # how long before a ramp slot the IPMI session is opened
MAX_PASSWORD_BYTES = 20  # IPMI 2.0's user password field


async def _kill(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            await asyncio.shield(proc.wait())


def find_ipmitool() -> str:
    path = shutil.which("ipmitool")
    if path is None:
        raise PowerControlError(
            "ipmitool is not installed (PATH has no 'ipmitool'): install it (Debian: apt-get install ipmitool), "
            "or set the node's bmc.options.transport: pyghmi (one process for every BMC: a dead BMC can then "
            "delay the others)"
        )
    return path


def _wrap(device: str, rc: int, stderr: str) -> PowerControlError:
    lines, probing = [], False
    for ln in (raw.strip() for raw in stderr.splitlines()):
        # -v's own chatter: the PEN registry, the VSO capability probe (refused by most BMCs)
        if ln.startswith("Running Get VSO"):
            probing = True
        elif probing and ln.startswith("Invalid completion code"):
            probing = False
        elif ln and not ln.startswith(("Loading IANA", "Discovered IPMB", "ipmitool> ")):
            lines.append(ln)
    text = "; ".join(ln.lstrip("> ") for ln in lines) or f"exit status {rc}"
    low = text.lower()
    if any(h in low for h in _AUTH_HINTS):
        return AuthenticationFailed(f"{device}: BMC refused the credentials ({text})")
    if any(h in low for h in _UNREACHABLE_HINTS):
        return DeviceUnreachable(f"{device}: no IPMI answer from the BMC (is it powered and on the network?)")
    if "invalid" in low or "not supported" in low or "unknown" in low or "failed" in low:
        return CommandRejected(f"{device}: BMC rejected the command ({text})")
    return PowerControlError(f"{device}: IPMI error: {text}")


class IpmitoolDriver(PowerDriver):
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
        cipher_suite: int = 3,
        binary: str | None = None,
    ) -> None:
        super().__init__(device, guard)
        if len(password.encode()) > MAX_PASSWORD_BYTES:
            raise PowerControlError(
                f"{device}: the BMC password is {len(password.encode())} bytes; IPMI 2.0 allows at most "
                f"{MAX_PASSWORD_BYTES} (ipmitool refuses a longer one): set a shorter password on the BMC and "
                "in the site's secret"
            )
        self.host, self.port = host, port
        self._binary = binary or find_ipmitool()
        self._user, self._cipher = user, cipher_suite
        self._env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "IPMI_PASSWORD": password}
        if kg:
            self._env["IPMI_KGKEY"] = kg

    def __repr__(self) -> str:  # never the credentials
        return f"IpmitoolDriver({self.device} {self.host}:{self.port})"

    def argv(self, *command: str) -> list[str]:
        # -N 1 -R n: retransmit every second; the guard's timeout ends the request, not ipmitool
        retries = str(max(1, int(self.guard.timeout_s)))
        base = [self._binary, "-I", "lanplus", "-H", self.host, "-p", str(self.port), "-U", self._user, "-E"]
        base += ["-C", str(self._cipher), "-N", "1", "-R", retries, "-v"]
        if "IPMI_KGKEY" in self._env:
            base.append("-K")
        return [*base, *command]

    async def _spawn(self, *command: str, stdin: int, stderr: int) -> asyncio.subprocess.Process:
        """One ipmitool process in a session of its own (so a kill takes its whole group)."""
        return await asyncio.create_subprocess_exec(
            *self.argv(*command),
            stdin=stdin,
            stdout=asyncio.subprocess.PIPE,
            stderr=stderr,
            env=self._env,
            start_new_session=True,
        )

    async def _run(self, what: str, *command: str) -> str:
        async def request() -> str:
            proc = await self._spawn(*command, stdin=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
            try:
                out, err = await proc.communicate()
            finally:
                await _kill(proc)  # timed out or cancelled: the request goes with its process
            if proc.returncode != 0:
                raise _wrap(self.device, proc.returncode, err.decode(errors="replace"))
            return out.decode(errors="replace")

        return await self.guard.call(what, request)

    async def status(self) -> PowerState:
        out = await self._run("get power", "chassis", "power", "status")
        m = _STATUS.search(out)
        return m.group(1).lower() if m else "unknown"  # type: ignore[return-value]

    async def on(self) -> None:
        await self._run("set power on", "chassis", "power", "on")

    async def on_at(self, slot: Slot) -> None:
        await sleep_until(slot.start - SESSION_AHEAD_S)
        async with self.guard.serial:  # the session is this BMC's only one until the command went
            shell = await self.guard.call("open session", self._open_shell, locked=True)
            try:
                await slot.wait()
                out = await self.guard.call(
                    "set power on", lambda: self._shell_request(shell, "chassis power on"), locked=True
                )
            finally:
                await _kill(shell)
        if not _POWERED_ON.search(out):
            raise _wrap(self.device, 1, out)

    async def _open_shell(self) -> asyncio.subprocess.Process:
        shell = await self._spawn("shell", stdin=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        try:
            await self._shell_request(shell, None)  # the session is open once the shell answers
        except BaseException:
            await _kill(shell)
            raise
        return shell

    async def _shell_request(self, shell: asyncio.subprocess.Process, command: str | None) -> str:
        """Send ``command`` (None: nothing) and an echo of the end marker; the output up to the
        marker. The shell exits when its session fails: its output then says why."""
        assert shell.stdin is not None and shell.stdout is not None
        shell.stdin.write(f"{command or ''}\necho {_END}\n".encode())
        await shell.stdin.drain()
        lines: list[str] = []
        while True:
            raw = await shell.stdout.readline()
            if not raw:  # the shell ended: no session
                await shell.wait()
                raise _wrap(self.device, shell.returncode or 1, "".join(lines))
            line = raw.decode(errors="replace")
            if line.strip() == _END:
                return "".join(ln for ln in lines if not ln.startswith("ipmitool> "))
            lines.append(line)

    async def soft_off(self) -> None:
        await self._run("set power shutdown", "chassis", "power", "soft")

    async def off(self) -> None:
        await self._run("set power off", "chassis", "power", "off")

    async def cycle(self) -> None:
        # on when off, reset when on (a power cycle of an off chassis is refused by some BMCs)
        if await self.status() == "off":
            await self.on()
        else:
            await self._run("set power reset", "chassis", "power", "reset")

    async def restore_policy(self) -> RestorePolicy | None:
        out = await self._run("get chassis status", "raw", "0x00", "0x01")
        try:
            first = int(out.split()[0], 16)
        except (IndexError, ValueError):
            raise PowerControlError(f"{self.device}: unreadable chassis status {out.strip()!r}") from None
        return _POLICY_NAMES.get((first >> 5) & 0b11)  # type: ignore[return-value]

    async def set_restore_policy(self, policy: RestorePolicy) -> None:
        try:
            await self._run("set power restore policy", "chassis", "policy", policy)
        except CommandRejected as exc:
            raise CommandRejected(f"{self.device}: BMC refused the power-restore policy {policy}: {exc}") from None
