"""A check's outcome: one line per thing checked, a problem naming what is wrong and the fix."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Finding:
    where: str  # "site file", "secret nodes[n1].bmc.password", "nats ups-monitor", "bmc n2", ...
    ok: bool
    text: str
    # the site's thing it is about, for the checks that follow: ("ups", name), ("node", name),
    # ("pdu", name) or ("credential", party); None for the file as a whole
    about: tuple[str, str] | None = None

    def line(self) -> str:
        return f"{'ok     ' if self.ok else 'PROBLEM'} {self.where}: {self.text}"

    def as_dict(self) -> dict:
        return asdict(self)


def ok(where: str, text: str, about: tuple[str, str] | None = None) -> Finding:
    return Finding(where, True, text, about)


def problem(where: str, text: str, about: tuple[str, str] | None = None) -> Finding:
    return Finding(where, False, text, about)


def failed(found: list[Finding], kind: str) -> set[str]:
    """The names of the site's things of ``kind`` that some problem in ``found`` is about."""
    return {f.about[1] for f in found if not f.ok and f.about is not None and f.about[0] == kind}
