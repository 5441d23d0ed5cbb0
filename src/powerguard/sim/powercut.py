"""The power-cut filesystem (:mod:`powerguard.sim.powercut_fs`) as a peer: mount it, let processes use it,
cut the power (what was not durable is gone), mount it again.

    pc = PowerCutFs(tmp_path / "pc").start()
    ... write under pc.mountpoint ...
    pc.cut()      # the daemon dies with the power; live/ becomes what was durable
    pc.start()    # the "machine" boots: the same mountpoint, only the durable state

Processes writing under the mount should be killed before the cut (as the power would); a
process still holding a file there gets ENOTCONN from then on.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path


def unavailable() -> str | None:
    """Why a FUSE mount cannot be made here (None: it can)."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing"
    if shutil.which("fusermount3") is None:
        return "fusermount3 not found: apt-get install fuse3"
    try:
        import mfusepy  # noqa: F401
    except (ImportError, OSError) as exc:
        return f"mfusepy not usable ({exc}): pip install mfusepy, apt-get install fuse3"
    return None


class PowerCutFs:
    def __init__(self, root: Path, mountpoint: Path | None = None, *, mode: str = "posix") -> None:
        self.root = Path(root)
        self.mode = mode  # fs.MODES: posix (names durable by their directory's fsync) or journal
        self.mountpoint = Path(mountpoint) if mountpoint else self.root / "mnt"
        self.proc: subprocess.Popen | None = None
        self.cuts = 0

    def start(self, timeout: float = 15.0) -> PowerCutFs:
        self.root.mkdir(parents=True, exist_ok=True)
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        if not (self.root / "uids.json").exists():
            from .powercut_fs import init  # mfusepy loads libfuse when imported

            init(self.root, self.mode)
        log = open(self.root / "fs.log", "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "powerguard.sim.powercut_fs", str(self.root), str(self.mountpoint)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while not (self.mounted() and os.path.ismount(self.mountpoint)):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self._unmount()
                raise RuntimeError(f"power-cut filesystem did not mount: {(self.root / 'fs.log').read_text()[-2000:]}")
            time.sleep(0.02)
        return self

    def cut(self, *, with_processes: tuple[subprocess.Popen, ...] = ()) -> None:
        """Power is cut: the daemon dies at once, then ``with_processes`` (the machine's other
        processes: their process groups), and only then the mount goes. Unmounted while a writer
        still ran, its writes would land in the directory under the mountpoint and look durable
        (a campaign saw acks for checkpoints written there). Only what was durable stays."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        for p in with_processes:  # the mount is dead (ENOTCONN) until they are gone
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        self._unmount()
        self.proc = None
        from .powercut_fs import cut

        cut(self.root)
        self.cuts += 1

    def stop(self) -> None:
        """A clean unmount (no cut): everything written stays."""
        if self.proc is None:
            return
        subprocess.run(["fusermount3", "-u", "-z", str(self.mountpoint)], capture_output=True)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def mounted(self) -> bool:
        """In the mount table (a mount whose daemon died is there too, answering ENOTCONN)."""
        with open("/proc/self/mounts") as f:
            return any(line.split()[1] == str(self.mountpoint) for line in f)

    def _unmount(self) -> None:
        for _ in range(100):
            if not self.mounted():
                return
            subprocess.run(["fusermount3", "-u", "-z", str(self.mountpoint)], capture_output=True)
            time.sleep(0.02)
        raise RuntimeError(f"{self.mountpoint}: still mounted")
