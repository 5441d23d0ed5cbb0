"""A local launcher: one configured command per job, run as its own process group.
Stop sends SIGTERM to the group, then SIGKILL after ``stop_timeout_s``; start launches the
command again (the job restores from its checkpoint). Used by the demo and the tests, and
by single-host sites without a scheduler."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from ..errors import SchedulerError
from .base import Scheduler, job_name, safe_env, trace_env


class ProcessJob(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    argv: list[str] = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    log: str | None = Field(default=None, description="Append stdout and stderr here (default: inherit)")


class ProcessOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    jobs: dict[str, ProcessJob] = Field(default_factory=dict)
    stop_timeout_s: float = Field(default=30.0, ge=0)
    state_dir: str | None = Field(
        default=None, description="Keep <job>.pid here, so a restarted power-control can still stop the job"
    )


class ProcessScheduler(Scheduler):
    kind = "process"

    def __init__(self, options: dict) -> None:
        self.opts = ProcessOptions.model_validate(options)
        self.one_stop_s = self.opts.stop_timeout_s + 10.0  # SIGTERM, the wait, SIGKILL and its reaping
        self.procs: dict[str, subprocess.Popen] = {}

    def _job(self, job: str) -> ProcessJob:
        try:
            return self.opts.jobs[job_name(job)]
        except KeyError:
            raise SchedulerError(f"process: no command configured for job {job!r}") from None

    def running(self, job: str) -> bool:
        p = self.procs.get(job)
        return p is not None and p.poll() is None

    async def start_job(self, job: str, *, nodes: Sequence[str], saga_id: str) -> str:
        job = job_name(job)
        if self.running(job):
            return f"job {job} already running (pid {self.procs[job].pid})"
        if (pgid := self._adopted(job)) is not None:  # started by hand, or by a power-control before a restart
            return f"job {job} already running (process group {pgid}, {self.opts.state_dir}/{job}.pid)"
        spec = self._job(job)
        env = safe_env(
            {
                **spec.env,
                "POWERGUARD_JOB": job,
                "POWERGUARD_SAGA": saga_id,
                "POWERGUARD_NODES": ",".join(nodes),
                **trace_env(),
            }
        )
        self.procs[job] = _launch(job, spec, env)
        if self.opts.state_dir:
            _write_pid(Path(self.opts.state_dir), job, self.procs[job].pid)
        return f"started job {job} (pid {self.procs[job].pid})"

    def _adopted(self, job: str) -> int | None:
        """The process group of ``job`` its pid file names, while a process of it runs (None: no
        state_dir, no pid file, or its group has exited): never started twice."""
        if not self.opts.state_dir:
            return None
        try:
            pgid = _read_pid(Path(self.opts.state_dir), job)
        except (OSError, ValueError, IndexError):
            return None
        return pgid if group_alive(pgid) else None

    async def stop_job(self, job: str, *, nodes: Sequence[str], saga_id: str) -> str:
        job = job_name(job)  # the pid file is <state_dir>/<job>.pid: never a path outside it
        p = self.procs.get(job)
        if p is None and self.opts.state_dir:
            return await self._stop_adopted(job)
        if p is None:  # never started here, and nowhere to look: "not running" would be a guess
            raise SchedulerError(
                f"process: job {job} was not started by this power-control and no state_dir is set: it cannot be "
                "found to stop it (set state_dir; a job started by hand writes its process group id to "
                f"<state_dir>/{job}.pid)"
            )
        if p.poll() is not None:
            return f"job {job} not running (it exited with {p.returncode})"
        _signal_group(p, signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.to_thread(p.wait), self.opts.stop_timeout_s)
            return f"stopped job {job} (exit {p.returncode})"
        except TimeoutError:
            stray = job_tree(p.pid)  # before the kill: a killed launcher's workers lose their parent
            _signal_group(p, signal.SIGKILL)
            _kill(stray)
            await asyncio.to_thread(p.wait)
            return f"killed job {job} after {self.opts.stop_timeout_s:.0f}s"

    async def _stop_adopted(self, job: str) -> str:
        """Stop a job a previous power-control started (its process group id is in the pid file)."""
        where = Path(self.opts.state_dir or ".") / f"{job}.pid"
        try:
            pgid = _read_pid(Path(self.opts.state_dir or "."), job)
        except FileNotFoundError:  # never started by a power-control: it may well be training
            raise SchedulerError(
                f"process: job {job} has no pid file {where}: it was not started by power-control, so it cannot be "
                "found to stop it (a job started by hand writes its process group id there: "
                f"`echo $(ps -o pgid= $$) > {where}` in its launch script)"
            ) from None
        except (OSError, ValueError, IndexError) as exc:
            raise SchedulerError(f"process: job {job}: {where} unreadable ({exc})") from None
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            return f"job {job} not running (its process group {pgid} has exited)"
        except OSError as exc:
            raise SchedulerError(f"process: job {job}: cannot signal process group {pgid}: {exc}") from None
        deadline = asyncio.get_running_loop().time() + self.opts.stop_timeout_s
        while asyncio.get_running_loop().time() < deadline:
            if not group_alive(pgid):
                return f"stopped job {job} (process group {pgid})"
            await asyncio.sleep(0.1)
        stray = job_tree(pgid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        _kill(stray)
        return f"killed job {job} (process group {pgid}) after {self.opts.stop_timeout_s:.0f}s"

    async def close(self) -> None:
        return None  # jobs outlive the service on purpose: a power-control restart must not stop training


def _proc_table(proc: Path) -> dict[int, tuple[str, int, int]] | None:
    """pid -> (state, ppid, pgrp) of every process, from ``/proc/<pid>/stat`` (None: no /proc)."""
    try:
        entries = [int(e) for e in os.listdir(proc) if e.isdigit()]
    except OSError:
        return None
    table: dict[int, tuple[str, int, int]] = {}
    for pid in entries:
        try:
            fields = (proc / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
            table[pid] = (fields[0], int(fields[1]), int(fields[2]))
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
    return table


def _dead(state: str) -> bool:
    return state in ("Z", "X")  # a zombie or dying: nothing left to stop


def group_alive(pgid: int, proc: Path = Path("/proc")) -> bool:
    """Whether a process of group ``pgid`` still runs. Zombies do not count: an adopted job's
    exited leader stays a zombie until its parent reaps it (a PID 1 that never reaps, in a
    container without an init, or the process that launched it and is busy), and ``killpg(pgid,
    0)`` answers for zombies as for the living, so a stop would wait out ``stop_timeout_s`` on
    a job that exited at once. Reads ``/proc``; without one, asks ``killpg``."""
    table = _proc_table(proc)
    if table is None:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return any(group == pgid and not _dead(state) for state, _, group in table.values())


def job_tree(pgid: int, proc: Path = Path("/proc")) -> set[int]:
    """The live processes of group ``pgid`` and every descendant of one, wherever its group: a
    launcher's workers may have their own (``torchrun`` starts each rank with
    ``start_new_session``), so killing the job's group alone leaves them training on, orphaned.
    Reads ``/proc``; without one, none (the group's kill is all there is)."""
    table = _proc_table(proc) or {}
    children: dict[int, list[int]] = {}
    for pid, (_, ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    todo = [pid for pid, (_, _, group) in table.items() if group == pgid]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, ()))
    return {pid for pid in found if not _dead(table[pid][0])}


def _kill(pids: set[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _write_pid(state_dir: Path, job: str, pid: int) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / f"{job}.pid").write_text(f"{pid}\n")


def _read_pid(state_dir: Path, job: str) -> int:
    return int((state_dir / f"{job}.pid").read_text().split()[0])


def _launch(job: str, spec: ProcessJob, env: dict[str, str]) -> subprocess.Popen:
    out = open(Path(spec.log), "ab") if spec.log else None
    try:
        return subprocess.Popen(
            spec.argv,
            env=env,
            cwd=spec.cwd,
            stdout=out,
            stderr=subprocess.STDOUT if out else None,
            start_new_session=True,
        )
    except OSError as exc:
        raise SchedulerError(f"process: cannot start job {job} ({spec.argv[0]}): {exc.strerror}") from None
    finally:
        if out is not None:
            out.close()


def _signal_group(p: subprocess.Popen, sig: signal.Signals) -> None:
    try:
        os.killpg(p.pid, sig)
    except ProcessLookupError:
        pass
