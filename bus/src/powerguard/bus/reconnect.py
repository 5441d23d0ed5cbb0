"""How a client tries again after it lost the server: exponential backoff with jitter, slower
for a refused credential than for an unreachable server, and one warning line per while with a
count instead of one per attempt. Pure, with the randomness and the clock injected; the client
(:meth:`Bus.connect`) hands :meth:`Backoff.choose` to nats.py as its
``reconnect_to_server_handler`` and :meth:`Backoff.failed` sees every failed attempt.

A revoked or expired credential used to retry every 0.25 s forever: ~440 attempts a minute, as
many "Authorization Violation" lines in the job's log and the broker's. Now: 0.25 s, 0.5 s,
1 s, ... up to 60 s between attempts while the server refuses the credential (after a minute,
at most one attempt in 30 s), up to 5 s while it cannot be reached (a broker restart costs
at most about 5 s more), each ±20 % so that thousands of ranks do not come back in step."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

BASE_S = 0.25
UNREACHABLE_CAP_S = 5.0
REFUSED_CAP_S = 60.0
JITTER = 0.2
SAY_EVERY_S = 30.0


def refused(exc: BaseException) -> bool:
    """The server refused the credential (revoked, expired, unknown), as opposed to not answering."""
    text = f"{type(exc).__name__} {exc}".lower()
    return "authorization" in text or "authentication" in text or "user authentication revoked" in text


@dataclass
class Backoff:
    base_s: float = BASE_S
    unreachable_cap_s: float = UNREACHABLE_CAP_S
    refused_cap_s: float = REFUSED_CAP_S
    jitter: float = JITTER
    rng: Callable[[], float] = random.random
    failures: int = 0  # consecutive failed attempts since the last connection
    refusing: bool = False  # the last failure was the server refusing the credential

    def nominal(self) -> float:
        """Seconds before the next attempt, before the jitter."""
        if self.failures == 0:
            return 0.0
        cap = self.refused_cap_s if self.refusing else self.unreachable_cap_s
        return min(cap, self.base_s * 2 ** (self.failures - 1))

    def delay(self) -> float:
        """Seconds before the next attempt (the nominal delay ±``jitter``)."""
        return self.nominal() * (1 - self.jitter + 2 * self.jitter * self.rng())

    def failed(self, exc: BaseException) -> None:
        self.failures += 1
        self.refusing = refused(exc)

    def connected(self) -> None:
        self.failures, self.refusing = 0, False

    def choose(self, servers: list[Any], _info: dict) -> tuple[Any, float]:
        """nats.py's reconnect handler: the server tried least (a cluster's others first), and the
        delay before trying it."""
        server = min(servers, key=lambda s: s.reconnects) if servers else None
        return server, self.delay()


@dataclass
class FailureLog:
    """One line for the first failure, then at most one per ``every_s`` with how many there were."""

    every_s: float = SAY_EVERY_S
    _last_said: float | None = None
    _since: int = 0

    def note(self, exc: BaseException, now: float, next_in_s: float) -> str | None:
        """The line to log for this failure, or None (counted, said later)."""
        self._since += 1
        if self._last_said is not None and now - self._last_said < self.every_s:
            return None
        count, self._since, self._last_said = self._since, 0, now
        why = str(exc) or type(exc).__name__
        if refused(exc):
            why = "the server refused the credential (revoked or expired?)"
        more = f" ({count} attempts since the last line)" if count > 1 else ""
        return f"nats: {why}{more}; trying again in {next_in_s:.1f}s, backing off"

    def connected(self) -> None:
        self._last_said, self._since = None, 0
