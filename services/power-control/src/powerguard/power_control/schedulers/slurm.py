"""Slurm: drain nodes before a shutdown, requeue-and-hold the affected jobs, resume nodes
after the restore (waiting for ``idle``, not ``idle*``) and release the jobs to start now."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from ..errors import SchedulerError
from .base import Scheduler, job_name, run


class SlurmOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    slurm_conf: str | None = Field(default=None, description="SLURM_CONF for the commands (default: Slurm's own)")
    bin_dir: str | None = Field(default=None, description="Where scontrol/squeue/sinfo live (default: PATH)")
    node_map: dict[str, str] = Field(default_factory=dict, description="PowerGuard node -> Slurm node name")
    job_ids: dict[str, list[str]] = Field(
        default_factory=dict, description="PowerGuard job -> Slurm job ids (default: squeue by job name)"
    )
    user: str | None = Field(default=None, description="Only Slurm jobs of this user (squeue -u)")
    command_timeout_s: float = Field(default=30.0, gt=0)
    resume_timeout_s: float = Field(default=120.0, gt=0, description="Wait for a resumed node to become idle")


class SlurmScheduler(Scheduler):
    kind = "slurm"

    def __init__(self, options: dict) -> None:
        self.opts = SlurmOptions.model_validate(options)
        self.one_stop_s = 3 * self.opts.command_timeout_s  # scontrol, scancel, squeue
        self._env = {"SLURM_CONF": self.opts.slurm_conf} if self.opts.slurm_conf else {}

    def _bin(self, name: str) -> str:
        return f"{self.opts.bin_dir.rstrip('/')}/{name}" if self.opts.bin_dir else name

    async def _cmd(self, *argv: str) -> str:
        return await run([self._bin(argv[0]), *argv[1:]], timeout_s=self.opts.command_timeout_s, env=self._env)

    def _node(self, node: str) -> str:
        return self.opts.node_map.get(node, node)

    async def job_ids(self, job: str, *, states: str = "PD,R,CG,S") -> list[str]:
        """Slurm job ids of a PowerGuard job: from ``job_ids`` in the site file, else the jobs
        with that name (of ``user`` when set). A name is never taken for an id: a job named
        ``1234`` does not stop Slurm job 1234."""
        job = job_name(job)
        if job in self.opts.job_ids:
            return [str(int(j)) for j in self.opts.job_ids[job]]
        user = ["-u", self.opts.user] if self.opts.user else []
        out = await self._cmd("squeue", "-h", "-n", job, *user, "-t", states, "-o", "%i")
        return [line.strip() for line in out.splitlines() if line.strip()]

    async def prepare_shutdown(self, node: str, *, saga_id: str, jobs: Sequence[str]) -> str:
        await self._cmd(
            "scontrol", "update", f"NodeName={self._node(node)}", "State=DRAIN", f"Reason=powerguard: outage {saga_id}"
        )
        stopped = [await self.stop_job(job, nodes=[node], saga_id=saga_id) for job in jobs]
        return f"drained {self._node(node)}" + (f"; {'; '.join(stopped)}" if stopped else "")

    async def stop_job(self, job: str, *, nodes: Sequence[str], saga_id: str) -> str:
        ids = await self.job_ids(job, states="R,CG,S,PD")
        for jid in ids:
            try:
                await self._cmd("scontrol", "requeuehold", jid)
            except SchedulerError as exc:
                if "already" not in str(exc).lower() and "pending" not in str(exc).lower():
                    raise
        return f"requeued and held slurm job(s) {','.join(ids)}" if ids else f"no slurm job named {job}"

    async def node_restored(self, node: str, *, saga_id: str) -> None:
        name = self._node(node)
        await self._cmd("scontrol", "update", f"NodeName={name}", "State=RESUME")
        deadline = time.monotonic() + self.opts.resume_timeout_s
        state = ""
        while time.monotonic() < deadline:
            state = (await self._cmd("sinfo", "-h", "-n", name, "-o", "%T")).strip()
            if state in ("idle", "mixed", "allocated", "completing"):
                return
            await asyncio.sleep(0.5)
        raise SchedulerError(
            f"slurm node {name} is {state or 'unknown'} {self.opts.resume_timeout_s:.0f}s after resume"
        )

    async def start_job(self, job: str, *, nodes: Sequence[str], saga_id: str) -> str:
        ids = await self.job_ids(job, states="PD")
        for jid in ids:
            await self._cmd("scontrol", "release", jid)
            await self._cmd("scontrol", "update", f"JobId={jid}", "StartTime=now")
        return f"released slurm job(s) {','.join(ids)}" if ids else f"no pending slurm job named {job}"
