"""``powerguard try``: the user's own training command inside the simulated outage drill.

1. **Reference**: the command once, straight through, without a bus (the agent's check mode,
   ``ckpt_agent._check``: its checkpoints in the try's own directory, its last step
   checkpointed at exit). It also says how many ranks the job has, how many steps it trains
   and how long a step takes.
2. **Drill**: the simulated site (:class:`~.site.SimSite`: embedded broker, the real
   services, a simulated UPS, PDU and one BMC per node) with the command as its job, started,
   stopped and restarted by power-control's process adapter; the agent's try mode from the
   environment (the site's bus, the job's name, the simulated nodes, a progress line per step);
   one outage (:func:`~.drill.run_drill`) with the chosen hold policy.
3. **Verdict**: the two runs' last checkpoints compared entry by entry (``ckpt_agent._compare``):
   model, optimizer, scheduler, registered state, every rank's RNG.

Nothing here changes what the job computes: the drill only stretches steps shorter than
``min_step_s`` (so that the outage falls inside training) and moves its checkpoints.
"""

from __future__ import annotations

import itertools
import math
import os
import statistics
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from powerguard.ckpt_agent import _check as C
from powerguard.ckpt_agent import _layout as L

from .errors import DrillError

DRILL_OVERHEAD_S = 10.0  # detection, checkpoint, final checkpoint and shutdown on the simulated site, about


@dataclass(frozen=True)
class Reference:
    """What the uninterrupted run showed."""

    world: int  # ranks
    first_step: int
    steps: int  # steps rank 0 trained
    step_s: float  # median step time (the drill's pace applied)
    seconds: float  # the whole run, start-up included
    log: Path


def job_environment(
    *, directory: Path, job: str, progress: Path, min_step_s: float, nats_url: str = "", nodes: list[str] = ()
) -> dict[str, str]:
    """The agent's mode for one run (``ckpt_agent._check``): the reference has no bus (no URL)."""
    env = {
        C.DIR: str(directory),
        C.FINAL: "1",
        C.TRY_JOB: job,
        C.TRY_PROGRESS: str(progress),
        C.TRY_MIN_STEP_S: f"{min_step_s:g}",
    }
    if nats_url:
        env |= {C.TRY_NATS_URL: nats_url, C.TRY_NODES: ",".join(nodes)}
    return env


def progress_lines(path: Path) -> list[tuple[int, int, float]]:
    """(rank, step, time) of every finished step, as the ranks wrote them."""
    out = []
    try:
        text = path.read_text()
    except OSError:
        return out
    for line in text.splitlines():
        try:
            rank, step, at = line.split()
            out.append((int(rank), int(step), float(at)))
        except ValueError:
            continue  # a line cut short by a kill
    return out


def reference_of(lines: list[tuple[int, int, float]], *, seconds: float, log: Path) -> Reference:
    """The reference's shape from its progress lines; a DrillError when it trained no step."""
    if not lines:
        raise DrillError(
            f"the reference run trained no step the agent saw (log {log}): does the script call "
            "guard.step(step) after each optimizer step?"
        )
    rank0 = [(s, t) for r, s, t in lines if r == 0]
    gaps = [b[1] - a[1] for a, b in itertools.pairwise(rank0)]
    return Reference(
        world=len({r for r, _, _ in lines}),
        first_step=min(s for s, _ in rank0),
        steps=len(rank0),
        step_s=statistics.median(gaps) if gaps else 0.0,
        seconds=seconds,
        log=log,
    )


def drill_fits(ref: Reference, *, warmup_steps: int, hold_s: float, min_step_s: float) -> str | None:
    """Why the job is too short for the outage to fall inside its training (None: it fits)."""
    step_s = max(ref.step_s, min_step_s, 1e-3)
    needed = warmup_steps + math.ceil((hold_s + DRILL_OVERHEAD_S) / step_s)
    if ref.steps >= needed:
        return None
    return (
        f"the job trains {ref.steps} steps of about {step_s:.3f} s; the drill needs about {needed}: "
        f"{warmup_steps} before the outage and {hold_s:g} s of hold plus ~{DRILL_OVERHEAD_S:g} s of checkpoint "
        "and shutdown while it still trains. Give the script more steps, or --min-step-s a larger pace "
        "(steps are stretched to it), or --hold-s a shorter hold"
    )


def run(command: list[str], *, env: dict[str, str], log: Path, timeout_s: float) -> tuple[int, float]:
    """Run ``command`` with the environment ``env`` (all of it); (exit status, seconds)."""
    started = time.monotonic()
    with open(log, "wb") as f:
        try:
            code = subprocess.run(command, stdout=f, stderr=subprocess.STDOUT, env=env, timeout=timeout_s).returncode
        except subprocess.TimeoutExpired:
            code = 124
        except OSError as exc:
            f.write(f"cannot run {command[0]}: {exc}\n".encode())
            code = 127
    return code, time.monotonic() - started


def newest_committed(root: Path, *, job: str, nodes: list[str] = ()) -> tuple[int, Path]:
    """(step, directory) of the job's newest checkpoint committed under ``root``. Node scope
    (a directory per simulated node): every node's files of that step, gathered by name into one
    directory of links (each node holds its own ranks' files, and its peers' replicas)."""
    fs, _ = L.fs_for(str(root))
    node_roots = [root / n for n in nodes if (root / n / job).is_dir()]
    roots = node_roots or [root]
    committed: dict[int, list[Path]] = {}
    for r in roots:
        for step, d in L.list_steps(fs, str(r), job):
            if os.path.exists(f"{d}/{L.COMMIT}"):
                committed.setdefault(step, []).append(Path(d))
    if not committed:
        raise DrillError(f"{root}: no committed checkpoint of job {job} (does the script call guard.close()?)")
    step = max(committed)
    if not node_roots:
        return step, committed[step][0]
    merged = root.parent / f"{root.name}-merged" / f"step-{step}"
    merged.mkdir(parents=True, exist_ok=True)
    for d in committed[step]:
        for f in d.iterdir():
            if f.is_file() and not (merged / f.name).exists():
                (merged / f.name).symlink_to(f)
    return step, merged
