"""apcupsd as the source: a client for its Network Information Server (NIS, TCP 3551, the
``status`` request), so sites already running apcupsd keep it."""

from __future__ import annotations

import asyncio
import struct

from .nut import UpsError, UpsUnreachable
from .reading import Reading

DEFAULT_PORT = 3551


def parse_status(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key.strip()] = value.strip()
    return out


def _number(value: str | None) -> float | None:
    if not value:
        return None
    head = value.split()[0]
    try:
        return float(head)
    except ValueError:
        return None


class ApcupsdDriver:
    def __init__(self, *, name: str, host: str, port: int | None, timeout: float = 2.0) -> None:
        self.name, self.host, self.port, self.timeout = name, host, port or DEFAULT_PORT, timeout

    async def status(self) -> dict[str, str]:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(self.host, self.port), self.timeout)
        except (OSError, TimeoutError) as exc:
            raise UpsUnreachable(
                f"ups {self.name}: apcupsd NIS at {self.host}:{self.port} unreachable: {exc or 'timeout'}"
            ) from None
        try:
            writer.write(struct.pack(">H", 6) + b"status")
            await writer.drain()
            chunks = []
            while True:
                (n,) = struct.unpack(">H", await asyncio.wait_for(reader.readexactly(2), self.timeout))
                if n == 0:
                    break
                chunks.append((await asyncio.wait_for(reader.readexactly(n), self.timeout)).decode(errors="replace"))
        except (OSError, TimeoutError, asyncio.IncompleteReadError) as exc:
            raise UpsUnreachable(
                f"ups {self.name}: apcupsd NIS at {self.host}:{self.port}: {exc or 'no reply within the timeout'}"
            ) from None
        finally:
            writer.close()
        return parse_status("".join(chunks))

    async def poll(self) -> Reading:
        s = await self.status()
        flags = s.get("STATUS", "").split()
        if not flags:
            raise UpsError(f"ups {self.name}: apcupsd reported no STATUS")
        if "COMMLOST" in flags:
            raise UpsError(f"ups {self.name}: apcupsd lost contact with the UPS (COMMLOST)")
        timeleft = _number(s.get("TIMELEFT"))
        values = {
            "charge_pct": _number(s.get("BCHARGE")),
            "runtime_s": timeleft * 60 if timeleft is not None else None,
            "load_pct": _number(s.get("LOADPCT")),
            "input_v": _number(s.get("LINEV")),
            "seconds_on_battery": _number(s.get("TONBATT")),
        }
        missing = tuple(k for k, v in values.items() if v is None)
        on_battery = "ONBATT" in flags
        low = "LOWBATT" in flags
        status = ("OB", "DISCHRG") if on_battery else ("OL",)
        status += (
            (("LB",) if low else ())
            + (("RB",) if "REPLACEBATT" in flags else ())
            + (("OVER",) if "OVERLOAD" in flags else ())
        )
        return Reading(
            on_battery=on_battery,
            low_battery=low,
            replace_battery="REPLACEBATT" in flags,
            overload="OVERLOAD" in flags,
            fsd="SHUTTING" in flags,
            status=status,
            partial=bool(missing),
            errors=tuple(f"{m} not reported" for m in missing),
            **values,
        )

    async def close(self) -> None:
        return None
