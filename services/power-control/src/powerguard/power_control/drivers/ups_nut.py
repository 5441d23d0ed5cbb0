"""A UPS's output through NUT: the instant commands of a long outage's last step, sent to upsd
over its network protocol (RFC 9271), as ``upscmd`` does.

``shutdown.return``: the UPS turns its output off after a delay and on again when mains returns,
so every machine it feeds boots into a known state (NUT's own "killpower" ends an outage with
it). ``shutdown.stop`` cancels a pending one (mains came back within the delay).

The upsd user needs the command in ``upsd.users`` (``instcmds = shutdown.return`` and
``instcmds = shutdown.stop``); without it upsd answers ``ERR ACCESS-DENIED``, reported as
:class:`CommandRejected` naming the setting. A UPS that does not list the command
(``LIST CMD``) is refused before anything is sent, naming what it lists. With NUT's command
tracking (``SET TRACKING ON``, upsd ≥ 2.8) the result is the driver's own (``SUCCESS`` or
``ERR ...``), never just upsd's acceptance; a upsd without tracking says only that it passed
the command on, and the result says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from ..errors import AuthenticationFailed, CommandRejected, DeviceUnreachable, PowerControlError
from .base import Guarded

DEFAULT_PORT = 3493
TRACKING_POLL_S = 0.1


class NutUpsOutput:
    """The output of one UPS behind upsd. Each call is its own connection (a long outage's
    last step is one or two commands: nothing to keep open, nothing shared between UPSes)."""

    kind = "nut"

    def __init__(
        self,
        device: str,
        guard: Guarded,
        *,
        host: str,
        ups: str,
        user: str,
        password: str,
        port: int = DEFAULT_PORT,
    ) -> None:
        self.device, self.guard = device, guard
        self.host, self.port, self.ups = host, port, ups
        self._user, self._password = user, password

    def __repr__(self) -> str:  # never the credentials
        return f"NutUpsOutput({self.device} {self.ups}@{self.host}:{self.port})"

    async def shutdown_return(self, delay_s: float | None = None) -> str:
        """Output off after ``delay_s`` (None: the UPS's own ``ups.delay.shutdown``), on again
        when mains returns. Returns what the UPS said."""
        arg = None if delay_s is None else f"{max(0, round(delay_s))}"
        return await self.guard.call("shutdown.return", lambda: self._instcmd("shutdown.return", arg))

    async def cancel(self) -> str:
        """Cancel a pending shutdown (``shutdown.stop``)."""
        return await self.guard.call("shutdown.stop", lambda: self._instcmd("shutdown.stop", None))

    # -------------------------------------------------------------- the protocol
    async def _instcmd(self, cmd: str, arg: str | None) -> str:
        try:
            reader, writer = await asyncio.open_connection(self.host, self.port)
        except OSError as exc:
            raise DeviceUnreachable(f"{self.device}: upsd at {self.host}:{self.port} does not answer ({exc})") from None
        try:
            ask = _Asker(self.device, reader, writer)
            listed = await ask.lines(f"LIST CMD {self.ups}")
            commands = {w.split()[2] for w in listed if w.startswith("CMD ")}
            if cmd not in commands:
                offered = ", ".join(sorted(commands)) or "none"
                raise CommandRejected(f"{self.device}: UPS {self.ups} does not offer {cmd} (it lists: {offered})")
            if (await ask.one(f"USERNAME {self._user}")) != "OK" or (
                await ask.one(f"PASSWORD {self._password}")
            ) != "OK":
                raise AuthenticationFailed(f"{self.device}: upsd refused user {self._user}")
            tracking = (await ask.one("SET TRACKING ON")) == "OK"
            reply = await ask.one(f"INSTCMD {self.ups} {cmd}" + (f" {arg}" if arg is not None else ""))
            if reply == "ERR ACCESS-DENIED":
                raise CommandRejected(
                    f"{self.device}: upsd user {self._user} may not run {cmd} on {self.ups} "
                    f"(upsd.users needs 'instcmds = {cmd}' in [{self._user}])"
                )
            if reply.startswith("ERR"):
                raise CommandRejected(f"{self.device}: upsd refused {cmd} on {self.ups}: {reply}")
            if not (tracking and reply.startswith("OK TRACKING ")):
                return f"{cmd} passed to the UPS by upsd (no command tracking: the driver's result unknown)"
            return await self._result(ask, cmd, reply.split()[2])
        finally:
            with contextlib.suppress(Exception):
                writer.close()
                await writer.wait_closed()

    async def _result(self, ask: _Asker, cmd: str, tracking_id: str) -> str:
        while True:  # the guard's timeout bounds this
            status = await ask.one(f"GET TRACKING {tracking_id}")
            if status == "SUCCESS":
                return f"{cmd} done by the UPS ({self.ups})"
            if status != "PENDING":
                raise CommandRejected(f"{self.device}: UPS {self.ups} did not carry out {cmd}: {status}")
            await asyncio.sleep(TRACKING_POLL_S)


class _Asker:
    """Request and reply lines on one upsd connection."""

    def __init__(self, device: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.device, self.reader, self.writer = device, reader, writer

    async def _line(self) -> str:
        raw = await self.reader.readline()
        if not raw:
            raise DeviceUnreachable(f"{self.device}: upsd closed the connection")
        return raw.decode(errors="replace").strip()

    async def one(self, request: str) -> str:
        self.writer.write(request.encode() + b"\n")
        await self.writer.drain()
        return await self._line()

    async def lines(self, request: str) -> list[str]:
        first = await self.one(request)
        if first == "ERR UNKNOWN-UPS":
            raise CommandRejected(f"{self.device}: upsd knows no UPS {request.split()[-1]} (check the UPS's name)")
        if first.startswith("ERR"):
            raise PowerControlError(f"{self.device}: upsd answered {request} with {first}")
        out, started = [], time.monotonic()
        while (line := await self._line()) and not line.startswith("END "):
            out.append(line)
            if time.monotonic() - started > 60:
                raise DeviceUnreachable(f"{self.device}: upsd's {request} never ended")
        return out
