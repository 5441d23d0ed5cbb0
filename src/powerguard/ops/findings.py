"""A check's outcome: one line per thing checked, a problem naming what is wrong and the fix."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Finding:
    where: str  # "site file", "secret nodes[n1].bmc.password", "nats ups-monitor", "bmc n2", ...
    ok: bool
    text: str

    def line(self) -> str:
        return f"{'ok     ' if self.ok else 'PROBLEM'} {self.where}: {self.text}"

    def as_dict(self) -> dict:
        return asdict(self)


def ok(where: str, text: str) -> Finding:
    return Finding(where, True, text)


def problem(where: str, text: str) -> Finding:
    return Finding(where, False, text)
