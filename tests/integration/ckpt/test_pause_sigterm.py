"""A job paused after its final checkpoint stops at once on SIGTERM even when its framework's
own SIGTERM handler runs a collective (Lightning 2.6 broadcasts on the default group) and one
rank is waiting in the pause's collective for the other (2 real gloo ranks under torchrun).
Before, that rank waited in C++, where no Python handler runs, so it never joined the
broadcast, the other rank's handler never returned, and torchrun killed both 30 s later (seen
in CI: ``test_framework_stop[lightning]`` took 30.7 s)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from tests.waiting import eventually

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TORCHRUN = Path(sys.executable).parent / "torchrun"
SCRIPT = Path(__file__).parent / "scripts" / "pause_sigterm.py"
STOP_WITHIN_S = 10.0  # torchrun's kill comes after 30 s


async def test_a_rank_waiting_in_the_pause_runs_a_frameworks_collective_handler_and_both_stop(tmp_path):
    argv = [str(TORCHRUN), "--standalone", "--nproc-per-node", "2", str(SCRIPT), str(tmp_path)]
    log = (tmp_path / "torchrun.log").open("w")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = await asyncio.create_subprocess_exec(*argv, stdout=log, stderr=asyncio.subprocess.STDOUT, env=env)
    try:
        ready = tmp_path / "ready"
        await eventually(lambda: ready.exists() or proc.returncode is not None, 120, "both ranks paused")
        assert proc.returncode is None, (tmp_path / "torchrun.log").read_text()[-3000:]
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 60)
        took = time.monotonic() - started
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        log.close()
    out = (tmp_path / "torchrun.log").read_text()
    assert took < STOP_WITHIN_S, f"the paused ranks took {took:.1f}s to stop after SIGTERM:\n{out[-3000:]}"
    exits = {n: (tmp_path / f"rank{n}.exit").read_text() for n in range(2) if (tmp_path / f"rank{n}.exit").exists()}
    assert exits == {0: "143", 1: "143"}, f"each rank leaves the pause as stopped: {exits}\n{out[-3000:]}"
