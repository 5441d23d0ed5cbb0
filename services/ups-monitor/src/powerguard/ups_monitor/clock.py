"""This host's clock against the server's: what an operator must see before it matters.

The coordinator judges a power event's age by the time JetStream stored it (the server's clock),
so a ups-monitor whose clock is off is still heard; but its events' own times (what the trace,
the console and the record show) and the host's other duties are off with it. Every
minute the monitor writes a probe into its own bucket (``pg_ups``, key ``clock.<site>.<host>``)
and reads the time the server stored that write at back (``STREAM.MSG.GET``): the offset is
the server's stamp minus the middle of the local send/receive window (its error at most half the
round trip, exported beside it). Exported
as ``powerguard_ups_monitor_clock_offset_seconds``; ``PowerGuardClockOffset`` is critical past 30 s.
"""

from __future__ import annotations

import logging
import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

from powerguard.bus import Bus

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Offset:
    seconds: float  # the server's clock minus this host's
    error_s: float  # half the round trip: the most the figure can be off by


async def probe(bus: Bus, site: str, *, clock: Callable[[], float] = time.time) -> Offset:
    """One measurement of the server's clock against ``clock``."""
    kv = await bus.ups_states()
    host = re.sub(r"[^A-Za-z0-9_-]", "-", socket.gethostname().split(".")[0]) or "host"
    key = f"clock.{site}.{host}"
    sent = clock()
    await kv.put(key, {"sent": sent})
    got = await bus.js.get_msg(f"KV_{kv.bucket}", subject=f"$KV.{kv.bucket}.{key}")
    back = clock()
    if got.time is None:
        raise ValueError("the server's answer carried no stored time")
    return Offset(seconds=round(got.time.timestamp() - (sent + back) / 2, 3), error_s=round((back - sent) / 2, 3))
