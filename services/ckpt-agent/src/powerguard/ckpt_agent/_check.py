"""Check and drill modes, set by the environment so a user's script runs unchanged under
``powerguard check-resume`` and ``powerguard try``.

check-resume: the checkpoints go to the check's own directory (no bus, no remote tier), the
run stops right after a checkpoint at a given step, and a run's last step is checkpointed at
``close()`` so two runs can be compared tensor by tensor (``_compare``).

try (the simulated site around the user's command): as above, plus the site's bus, the job's
name and the simulated nodes replace what the script says (a script written for the real site
is drilled on the simulated one without an edit); every rank writes a line per step
(``rank step unix-time``) to the drill's progress file, and steps shorter than
``min_step_s`` are stretched to it (the outage must fall inside training; a CPU step is far
shorter than a GPU's). Timing only: nothing the job computes changes.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass

DIR, STOP_AT, FINAL = "POWERGUARD_CHECK_DIR", "POWERGUARD_CHECK_STOP_AT", "POWERGUARD_CHECK_FINAL"
TRY_NATS_URL, TRY_JOB, TRY_NODES = "POWERGUARD_TRY_NATS_URL", "POWERGUARD_TRY_JOB", "POWERGUARD_TRY_NODES"
TRY_PROGRESS, TRY_MIN_STEP_S = "POWERGUARD_TRY_PROGRESS", "POWERGUARD_TRY_MIN_STEP_S"


@dataclass(frozen=True)
class CheckMode:
    directory: str | None = None  # the checkpoints' root instead of local_dir
    stop_at: int | None = None  # checkpoint this step, then exit (SystemExit 0, every rank)
    final: bool = False  # checkpoint the last step at close()
    nats_url: str | None = None  # try: the simulated site's bus (else: no bus in check mode)
    job: str | None = None  # try: the job's name at the simulated site
    nodes: tuple[str, ...] = ()  # try: the simulated nodes, in rank order (rank r on nodes[r * n // world])
    progress: str | None = None  # try: every rank appends "rank step time" here after each step
    min_step_s: float = 0.0  # try: a step boundary comes at most this often

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> CheckMode:
        stop = env.get(STOP_AT, "")
        if stop and not stop.isdigit():
            raise ValueError(f"{STOP_AT}={stop!r}: a step number")
        try:
            min_step_s = float(env.get(TRY_MIN_STEP_S) or 0)
        except ValueError:
            raise ValueError(f"{TRY_MIN_STEP_S}={env[TRY_MIN_STEP_S]!r}: seconds") from None
        return cls(
            env.get(DIR) or None,
            int(stop) if stop else None,
            env.get(FINAL, "") == "1",
            nats_url=env.get(TRY_NATS_URL) or None,
            job=env.get(TRY_JOB) or None,
            nodes=tuple(n for n in env.get(TRY_NODES, "").split(",") if n),
            progress=env.get(TRY_PROGRESS) or None,
            min_step_s=min_step_s,
        )

    @property
    def on(self) -> bool:
        return self.directory is not None

    def framework_root(self, dirpath: str | os.PathLike) -> str:
        """Where a framework's checkpoints go: the check's directory, else the script's."""
        return os.path.abspath(self.directory or os.fspath(dirpath))

    def framework_job(self, job: str) -> str:
        return self.job or job if self.on else job

    def node(self, env: Mapping[str, str] = os.environ) -> str | None:
        """try: this rank's simulated node (from torchrun's RANK and WORLD_SIZE); None otherwise."""
        if not self.nodes:
            return None
        rank, world = int(env.get("RANK", 0)), max(1, int(env.get("WORLD_SIZE", 1)))
        return self.nodes[rank * len(self.nodes) // world]

    def root(self, local_root: str, *, node: str, node_scope: bool) -> str:
        """The checkpoints' root: under try every simulated node has its own disk (node scope)."""
        return os.path.join(local_root, node) if self.nodes and node_scope else local_root

    def at_step(self, rank: int, step: int, last_at: float) -> tuple[bool, float]:
        """After each step: try's progress line and pace (``last_at``: the previous boundary's
        monotonic time, as returned); (True when check-resume stops here, this boundary's time)."""
        now = 0.0
        if self.min_step_s > 0:
            wait = last_at + self.min_step_s - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            now = time.monotonic()
        if self.progress is not None:
            with open(self.progress, "a") as f:
                f.write(f"{rank} {step} {time.time():.3f}\n")
        return step == self.stop_at, now
