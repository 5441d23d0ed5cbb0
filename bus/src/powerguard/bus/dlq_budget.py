"""How many rejected messages a consumer copies to its dead-letter queue (pure, clock injected).

A dead letter is a publish the server must store and acknowledge: a round trip for every piece
of junk. A party flooding a subject it may publish on (a training job's agent on its own ack
subject) would make the site's consumer spend its time copying junk. So each consumer copies at
most ``burst`` dead letters at once and ``rate_per_s`` after that; the rest are still refused
(terminated, never handled), counted by reason in ``powerguard_bus_dead_letters_suppressed_total``
and summed up in one log line per ``report_every_s``. Nothing is silent, and junk costs the
consumer a decode and a terminate, not a stored copy.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class DeadLetterBudget:
    rate_per_s: float = 20.0
    burst: float = 100.0
    report_every_s: float = 10.0
    _tokens: float | None = None
    _last: float | None = None
    _suppressed: dict[str, int] = field(default_factory=dict)  # reason -> count since the last report
    _sample: str | None = None  # a subject of the suppressed ones (the report names it)
    _reported_at: float | None = None

    def take(self, now: float) -> bool:
        """True when this rejected message may be copied to the DLQ now."""
        tokens = self.burst if self._tokens is None else self._tokens
        if self._last is not None:
            tokens = min(self.burst, tokens + (now - self._last) * self.rate_per_s)
        self._last = now
        if tokens >= 1.0:
            self._tokens = tokens - 1.0
            return True
        self._tokens = tokens
        return False

    def suppressed(self, reason: str, subject: str) -> None:
        """A rejected message that was not copied (its reason and subject)."""
        self._suppressed[reason] = self._suppressed.get(reason, 0) + 1
        self._sample = subject

    def report(self, now: float) -> str | None:
        """Once per ``report_every_s`` while messages were suppressed: what to log."""
        if not self._suppressed:
            return None
        if self._reported_at is not None and now - self._reported_at < self.report_every_s:
            return None
        self._reported_at = now
        counts = ", ".join(f"{n} {reason}" for reason, n in sorted(self._suppressed.items()))
        text = (
            f"{sum(self._suppressed.values())} rejected message(s) refused without a dead-letter copy "
            f"({counts}; e.g. on {self._sample}): over {self.rate_per_s:g} dead letters/s"
        )
        self._suppressed = {}
        return text
