"""The scheduler adapter interface: how power-control stops jobs before a shutdown and
starts them again after the restore."""

from __future__ import annotations

import asyncio
import os
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence

from powerguard.schemas import InvalidSubjectToken, token

from ..errors import SchedulerError

# what a hook, a scheduler command or a launched job may see of power-control's environment:
# never its credentials (BMC passwords, NATS credentials, PDU communities referenced by `env`)
SAFE_ENV_NAMES = frozenset(
    {"PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "SHELL", "PYTHONPATH", "VIRTUAL_ENV"}
)
SAFE_ENV_PREFIXES = ("LC_", "SLURM_", "DOCKER_", "XDG_")


def safe_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """An allowlisted copy of the environment plus ``extra`` (what the site file configures)."""
    base = {k: v for k, v in os.environ.items() if k in SAFE_ENV_NAMES or k.startswith(SAFE_ENV_PREFIXES)}
    return {**base, **(extra or {})}


def job_name(job: str) -> str:
    """A job name as a subject token (A-Z a-z 0-9 _ -): it never becomes a path outside an
    adapter's directory, an option of a command, or anything but a name."""
    try:
        return token(job, what="job")
    except InvalidSubjectToken as exc:
        raise SchedulerError(str(exc)) from None


class Scheduler(ABC):
    kind = "?"
    one_stop_s = 60.0  # the longest one job's stop takes by the adapter's own timeouts (the plan's bound)

    def stop_bound_s(self, jobs: int) -> float:
        """The longest :meth:`prepare_shutdown` of ``jobs`` jobs takes (one after the other)."""
        return max(1, jobs) * self.one_stop_s

    async def prepare_shutdown(self, node: str, *, saga_id: str, jobs: Sequence[str]) -> str:
        """Before the node goes down: keep new work off it and stop its jobs. Returns a detail line."""
        done = [await self.stop_job(job, nodes=[node], saga_id=saga_id) for job in jobs]
        return "; ".join(d for d in done if d) or "no jobs"

    @abstractmethod
    async def stop_job(self, job: str, *, nodes: Sequence[str], saga_id: str) -> str: ...

    @abstractmethod
    async def start_job(self, job: str, *, nodes: Sequence[str], saga_id: str) -> str: ...

    async def node_restored(self, node: str, *, saga_id: str) -> None:
        """After the node is back: let the scheduler use it again."""
        return None

    async def on_battery(self, nodes: Sequence[str], *, saga_id: str) -> str:
        """An outage began (the saga's first announcement): keep new work off the nodes at risk."""
        return ""

    async def outage_over(self, nodes: Sequence[str], *, saga_id: str) -> str:
        """The saga ended (cancelled, done or failed): undo what :meth:`on_battery` did that
        no restore undid (a cancelled outage powers nothing off)."""
        return ""

    async def node_powered_off(self, node: str, *, saga_id: str) -> None:
        """The node's shutdown ended with it off (never raises: the shutdown is done)."""
        return None

    async def check(self, feeds: Mapping[str, Sequence[str]] | None = None) -> str | None:
        """Can the adapter reach what it drives, and does it agree with the site file's power
        topology (``feeds``: node -> the UPSes feeding it)? For ``powerguard config check``:
        None, or what is wrong."""
        return None

    async def close(self) -> None:
        return None


class NoScheduler(Scheduler):
    """No scheduler: jobs are stopped by the power-off and restarted by whatever the site runs."""

    kind = "none"
    one_stop_s = 0.0

    async def prepare_shutdown(self, node: str, *, saga_id: str, jobs: Sequence[str]) -> str:
        return "no scheduler configured"

    async def stop_job(self, job: str, *, nodes: Sequence[str], saga_id: str) -> str:
        return "no scheduler configured"

    async def start_job(self, job: str, *, nodes: Sequence[str], saga_id: str) -> str:
        return "no scheduler configured"


class DryRunScheduler(Scheduler):
    """The site's own scheduler in a drill: says what it would do, touches nothing (a drill's
    report names the adapter the site really runs, e.g. ``scheduler:process``)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    async def prepare_shutdown(self, node: str, *, saga_id: str, jobs: Sequence[str]) -> str:
        return f"dry-run: would stop {', '.join(jobs) or 'no jobs'} on {node} ({self.kind})"

    async def stop_job(self, job: str, *, nodes: Sequence[str], saga_id: str) -> str:
        return f"dry-run: would stop {job} on {', '.join(nodes)} ({self.kind})"

    async def start_job(self, job: str, *, nodes: Sequence[str], saga_id: str) -> str:
        return f"dry-run: would restart {job} on {', '.join(nodes)} ({self.kind})"


def trace_env() -> dict[str, str]:
    """W3C ``TRACEPARENT`` of the current span, for a child process to join the outage trace."""
    from opentelemetry.propagate import inject

    carrier: dict[str, str] = {}
    inject(carrier)
    return {"TRACEPARENT": carrier["traceparent"]} if "traceparent" in carrier else {}


async def run(argv: Sequence[str], *, timeout_s: float, env: Mapping[str, str] | None = None, what: str = "") -> str:
    """Run a command (never through a shell); its stdout, or SchedulerError naming it."""
    label = what or argv[0]
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=safe_env(env),
        )
    except OSError as exc:
        raise SchedulerError(f"{label}: cannot run {argv[0]}: {exc.strerror}") from None
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise SchedulerError(f"{label}: {' '.join(argv)} did not finish within {timeout_s:.0f}s") from None
    if proc.returncode != 0:
        msg = (err or out).decode(errors="replace").strip().splitlines()
        raise SchedulerError(f"{label}: {' '.join(argv)} exited {proc.returncode}: {msg[-1] if msg else ''}")
    return out.decode(errors="replace")
