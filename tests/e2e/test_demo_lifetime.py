"""A `powerguard demo` killed hard (SIGKILL: an OOM kill, a CI job cut off) takes its whole site
with it: the broker, the simulated BMCs and UPS, the three services. Each runs in a process
group of its own (a Ctrl-C in the terminal must not reach them before the demo stops them in
order), so nothing else would end them: they were seen still running an hour after a CI run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.waiting import eventually_sync

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def processes_of(workdir: Path) -> dict[int, str]:
    """Every process whose command line names the demo's work directory (its site's processes:
    the broker's store, the services' site file, the BMCs' state files), by pid."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(workdir) in argv:
            out[int(entry.name)] = argv[:200]
    return out


def test_a_demo_killed_hard_takes_its_site_with_it(tmp_path):
    workdir = tmp_path / "site"
    demo = subprocess.Popen(
        [sys.executable, "-m", "powerguard.cli", "demo", "--workdir", str(workdir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen: list[str] = []
    try:
        assert demo.stdout is not None
        deadline = time.monotonic() + 180
        for line in demo.stdout:  # the outage under way: every part of the site is running
            seen.append(line)
            if "saga checkpointing" in line or time.monotonic() > deadline:
                break
        site = processes_of(workdir)
        assert len(site) >= 5, (site, "".join(seen[-30:]))  # broker, BMCs, services at least
        demo.kill()
        demo.wait(10)
        left: dict[int, str] = {}

        def gone() -> bool:
            left.clear()
            left.update(processes_of(workdir))
            return not left

        eventually_sync(gone, 30, "the demo's site processes to end", every=0.2, details=lambda: str(left))
    finally:
        if demo.poll() is None:
            demo.kill()
        for pid in processes_of(workdir):  # what the test started, it ends (also when it fails)
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
