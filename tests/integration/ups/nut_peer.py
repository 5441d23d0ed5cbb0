"""A real NUT server for tests: ``dummy-ups`` + ``upsd`` on a free loopback port (the simulated
site's launcher, :mod:`powerguard.sim.nut`; a missing NUT skips locally and fails under CI)."""

from __future__ import annotations

from pathlib import Path

from powerguard.sim.nut import NutMissing, NutUps, free_port
from tests.conftest import require_binary

__all__ = ["NutServer", "free_port", "require_nut"]


def require_nut() -> None:
    """NUT's upsd and dummy-ups are installed (skip locally, fail under CI otherwise)."""
    from powerguard.sim.nut import DUMMY_PATHS, UPSD_PATHS, find

    try:
        find(UPSD_PATHS, "upsd")
        find(DUMMY_PATHS, "dummy-ups")
    except NutMissing:
        require_binary("upsd", "nut-server")


class NutServer(NutUps):
    def __init__(self, tmp: Path, **kw) -> None:
        try:
            super().__init__(tmp, **kw)
        except NutMissing:
            require_binary("upsd", "nut-server")  # skips locally, fails under CI=true
            raise
