"""When ups-monitor is ready: it reads each UPS and the server has stored what it published with
its credential (a status report follows every first reading, so the first poll settles both). A
monitor whose credential cannot publish power events would otherwise look healthy while every
outage goes unseen. Pure: the service reports what happened, :meth:`Readiness.verdict` says it."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Readiness:
    ups: tuple[str, ...]
    unwatched: dict[str, str] = field(default_factory=dict)  # UPS -> why it cannot be watched at all
    _read: dict[str, str | None] = field(default_factory=dict)  # UPS -> None (read) or its last error
    _publish: str | None = "no event published yet"  # None once the server stored one; else why not

    def read(self, ups: str) -> None:
        self._read[ups] = None

    def unreadable(self, ups: str, error: str) -> None:
        self._read[ups] = error

    def published(self) -> None:
        self._publish = None

    def publish_failed(self, error: str) -> None:
        self._publish = f"cannot publish power events with its credential: {error}"

    @property
    def can_publish(self) -> bool:
        return self._publish is None

    def verdict(self) -> tuple[bool, str]:
        """(ready, what is missing, or "ok")."""
        missing = [f"ups {u}: {why}" for u, why in self.unwatched.items()]
        for ups in self.ups:
            if ups in self.unwatched:
                continue
            if ups not in self._read:
                missing.append(f"ups {ups}: not read yet")
            elif self._read[ups] is not None:
                missing.append(f"ups {ups}: {self._read[ups]}")
        if self._publish is not None:
            missing.insert(0, self._publish)
        return (not missing, "; ".join(missing) or "ok")
