"""Power-cut campaigns (tests with fixed seeds, bench/powercut.py with many): a job saving
checkpoints on the power-cut filesystem loses power at a random instant; after the "reboot" a
fresh process restores.

Invariants checked per cut: the restore raises nothing; it returns a checkpoint at least as new
as the newest one acked before the cut (a save that returned) and at most the one in flight;
its weights are bit-exact those of that step (never a partial checkpoint).

With ``remote=True`` the job's remote tier (a second directory on the same power-cut
filesystem: the NAS loses power with the node) gets a copy of every committed checkpoint, and
after the cut the node is gone: the restore runs with an empty local tier, from the remote one,
and must return at least the newest checkpoint whose copy was reported committed remotely (what
raises an ack to ``remote``)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import PowerCutFs

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class CutResult:
    seed: int
    cut_after_s: float
    acked: list[int] = field(default_factory=list)
    remote: list[int] | None = None  # copies reported committed remotely (remote campaigns)
    restored: int | None = None
    bit_exact: bool = False
    error: str | None = None
    restore_log: str = ""  # what the restore logged (why it skipped what it skipped)
    durable: list[str] = field(default_factory=list)  # the job's step directories after the cut

    @property
    def violations(self) -> list[str]:
        out = []
        if self.error:
            out.append(f"seed {self.seed}: {self.error}")
            return out
        newest = max(self.acked, default=0)
        floor = max(self.remote, default=0) if self.remote is not None else newest
        what = "copied step" if self.remote is not None else "acked step"
        if self.restored is None or self.restored < floor:
            out.append(f"seed {self.seed}: {what} {floor} but restored {self.restored}")
        elif self.restored > newest + 1:
            out.append(f"seed {self.seed}: restored {self.restored}, newer than the one in flight ({newest + 1})")
        if not self.bit_exact:
            out.append(f"seed {self.seed}: step {self.restored} restored with other weights (a partial checkpoint)")
        return out


def _trainer(directory: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "tests.powercut.trainer", str(directory), *extra]


def checkpoint_cut(root: Path, seed: int, *, max_after_s: float = 2.5, remote: bool = False) -> CutResult:
    """One cut: a job saving every step, power lost ``uniform(0.2, max_after_s)`` s after its
    first ack, then a restore in a fresh process (``remote``: from the remote tier alone)."""
    rng = random.Random(seed)
    result = CutResult(seed=seed, cut_after_s=round(rng.uniform(0.2, max_after_s), 3))
    pc = PowerCutFs(Path(root) / f"cut-{seed}{'-remote' if remote else ''}").start()
    ckpt = pc.mountpoint / "ckpt"
    extra = ("--remote", f"file://{pc.mountpoint / 'nas'}") if remote else ()
    if remote:
        result.remote = []
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    job = subprocess.Popen(
        _trainer(ckpt, *extra),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
        start_new_session=True,
    )
    first = threading.Event()

    def read() -> None:
        assert job.stdout is not None
        for line in job.stdout:
            kind, _, value = line.strip().partition(" ")
            if kind not in ("acked", "remote"):
                continue
            if not value.isdigit():  # the harness's own fault, never taken for the product's
                result.error = result.error or f"harness: the job's line {line.strip()!r} does not parse"
                continue
            if kind == "acked":
                result.acked.append(int(value))
                first.set()
            elif result.remote is not None:
                result.remote.append(int(value))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        if not first.wait(60):
            result.error = "the job never acked a checkpoint"
            return result
        time.sleep(result.cut_after_s)  # the cut's instant: what the campaign varies
        pc.cut(with_processes=(job,))  # the file system first, then the job, then the mount goes
        reader.join(5)
        pc.start()
        if remote:  # the node is gone: its local tier with it
            ckpt = Path(root) / f"cut-{seed}-new-node"
        job_dir = (pc.mountpoint / "nas" / "pc") if remote else (ckpt / "pc")
        result.durable = (
            sorted(f"{d.name}{'' if (d / 'COMMIT').exists() else ' (no COMMIT)'}" for d in job_dir.iterdir())
            if job_dir.is_dir()
            else []
        )
        out = subprocess.run(
            _trainer(ckpt, "--restore", *extra), cwd=ROOT, capture_output=True, text=True, env=env, timeout=120
        )
        line = next((ln for ln in out.stdout.splitlines() if ln.startswith("restored ")), None)
        result.restore_log = "\n".join(ln for ln in out.stderr.splitlines() if "UserWarning" not in ln)[-2000:]
        if out.returncode != 0 or line is None:
            last = (out.stderr or out.stdout).strip().splitlines()[-1:] or [f"exit {out.returncode}"]
            result.error = f"restore failed: {last[0]}"
        else:
            _, step, verdict = line.split()
            result.restored, result.bit_exact = int(step), verdict == "ok"
        return result
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
        pc.stop()
