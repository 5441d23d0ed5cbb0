"""NUT: an asyncio client for the upsd network protocol (RFC 9271) and the ``nut`` driver.

Polls with ``GET VAR`` (one round trip each, ~0.1 ms) rather than ``LIST VAR``. ``ERR ...``
replies become precise exceptions."""

from __future__ import annotations

import asyncio
import shlex

from powerguard.schemas.errors import PowerGuardError

from .reading import Reading

DEFAULT_PORT = 3493
VALUES = {
    "battery.charge": "charge_pct",
    "battery.runtime": "runtime_s",
    "ups.load": "load_pct",
    "input.voltage": "input_v",
}


class UpsError(PowerGuardError):
    """A UPS could not be read."""


class UpsUnreachable(UpsError):
    """No answer from the UPS (or its server) within the timeout."""


class NutError(UpsError):
    """upsd answered ``ERR <code>``."""

    def __init__(self, code: str, context: str) -> None:
        super().__init__(f"{context}: upsd says ERR {code}{_HINTS.get(code, '')}")
        self.code = code


_HINTS = {
    "UNKNOWN-UPS": " (no such UPS name on this upsd: check ups_name)",
    "ACCESS-DENIED": " (wrong user/password, or the user lacks rights in upsd.users)",
    "DATA-STALE": " (upsd has no fresh data from its driver)",
    "DRIVER-NOT-CONNECTED": " (upsd's driver for this UPS is not running)",
    "VAR-NOT-SUPPORTED": "",
}


class NutClient:
    """One connection to upsd. Not for concurrent use: the driver serializes calls."""

    def __init__(
        self,
        host: str,
        port: int = DEFAULT_PORT,
        *,
        user: str | None = None,
        password: str | None = None,
        timeout: float = 2.0,
    ) -> None:
        self.host, self.port, self.user, self.password, self.timeout = host, port, user, password, timeout
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def connect(self) -> None:
        try:
            self._reader, self._writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port), self.timeout
            )
        except (OSError, TimeoutError) as exc:
            raise UpsUnreachable(f"upsd at {self.host}:{self.port} unreachable: {exc or 'timeout'}") from None
        if self.user:
            await self._command(f"USERNAME {self.user}", "login")
            await self._command(f"PASSWORD {self.password or ''}", "login")

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            try:
                await self._writer.wait_closed()
            except OSError:
                pass
            self._writer = self._reader = None

    async def _command(self, line: str, context: str) -> str:
        if self._writer is None:
            await self.connect()
        assert self._writer is not None and self._reader is not None
        try:
            self._writer.write(line.encode() + b"\n")
            await self._writer.drain()
            reply = await asyncio.wait_for(self._reader.readline(), self.timeout)
        except (OSError, TimeoutError) as exc:
            await self.close()
            raise UpsUnreachable(f"upsd at {self.host}:{self.port}: {exc or 'no reply within the timeout'}") from None
        if not reply:
            await self.close()
            raise UpsUnreachable(f"upsd at {self.host}:{self.port} closed the connection")
        text = reply.decode(errors="replace").strip()
        if text.startswith("ERR "):
            raise NutError(text[4:].split()[0], context)
        return text

    async def get_var(self, ups: str, var: str) -> str:
        reply = await self._command(f"GET VAR {ups} {var}", f"{ups} {var}")
        parts = shlex.split(reply)  # VAR <ups> <var> "<value>"
        if len(parts) != 4 or parts[0] != "VAR":
            raise UpsError(f"{ups} {var}: unexpected reply {reply!r}")
        return parts[3]

    async def set_var(self, ups: str, var: str, value: str) -> None:
        await self._command(f'SET VAR {ups} {var} "{value}"', f"{ups} {var}")


class NutDriver:
    """Polls one UPS on one upsd."""

    def __init__(
        self,
        *,
        host: str,
        port: int | None,
        ups_name: str,
        user: str | None = None,
        password: str | None = None,
        timeout: float = 2.0,
    ) -> None:
        self.ups_name = ups_name
        self.client = NutClient(host, port or DEFAULT_PORT, user=user, password=password, timeout=timeout)
        self._lock = asyncio.Lock()

    async def poll(self) -> Reading:
        async with self._lock:
            status = await self.client.get_var(self.ups_name, "ups.status")
            if status.strip() in ("", "WAIT"):
                raise UpsError(f"{self.ups_name}: upsd has no status yet ({status or 'empty'})")
            values: dict[str, float] = {}
            errors: list[str] = []
            for var, field_name in VALUES.items():
                try:
                    values[field_name] = float(await self.client.get_var(self.ups_name, var))
                except NutError as exc:
                    if exc.code != "VAR-NOT-SUPPORTED":
                        raise
                    errors.append(f"{var} not supported")
                except ValueError:
                    errors.append(f"{var}: not a number")
            return Reading.from_status(status, partial=bool(errors), errors=tuple(errors), **values)

    async def close(self) -> None:
        await self.client.close()
