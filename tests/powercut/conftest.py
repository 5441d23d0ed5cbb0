from __future__ import annotations

import pytest

from tests.conftest import IN_CI

from . import PowerCutFs, unavailable


def _mounted(tmp_path, mode: str):
    why = unavailable()
    if why:
        if IN_CI:
            pytest.fail(f"power-cut filesystem: {why} (CI must provide it)")
        pytest.skip(why)
    return PowerCutFs(tmp_path / "powercut", mode=mode).start()


@pytest.fixture
def powercut(tmp_path):
    """A mounted power-cut filesystem, POSIX's promises only (skipped locally, failed under CI,
    where FUSE is missing)."""
    pc = _mounted(tmp_path, "posix")
    yield pc
    pc.stop()


@pytest.fixture
def powercut_journal(tmp_path):
    """The same with a journaling file system's metadata (ext4 data=ordered, XFS)."""
    pc = _mounted(tmp_path, "journal")
    yield pc
    pc.stop()
