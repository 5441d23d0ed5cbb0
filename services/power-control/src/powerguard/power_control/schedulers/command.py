"""A user hook: an argv list per action (no shell), with the saga, job and node in env vars
(POWERGUARD_ACTION, POWERGUARD_SAGA, POWERGUARD_JOB, POWERGUARD_NODE, POWERGUARD_NODES).
Hooks see an allowlisted environment (never power-control's credentials) plus ``env``."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from .base import Scheduler, job_name, run, trace_env


class CommandOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    stop: list[str] | None = Field(default=None, description="argv run to stop a job")
    start: list[str] | None = Field(default=None, description="argv run to start a job")
    drain: list[str] | None = Field(default=None, description="argv run before a node shuts down")
    resume: list[str] | None = Field(default=None, description="argv run after a node is back")
    timeout_s: float = Field(default=60.0, gt=0)
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment for the hooks")


class CommandScheduler(Scheduler):
    kind = "command"

    def __init__(self, options: dict) -> None:
        self.opts = CommandOptions.model_validate(options)
        self.one_stop_s = self.opts.timeout_s

    async def _hook(
        self, action: str, argv: list[str] | None, *, saga_id: str, job: str = "", nodes: Sequence[str] = ()
    ) -> str:
        if not argv:
            return f"no {action} hook"
        env = {
            **self.opts.env,
            "POWERGUARD_ACTION": action,
            "POWERGUARD_SAGA": saga_id,
            "POWERGUARD_JOB": job_name(job) if job else "",
            "POWERGUARD_NODE": nodes[0] if len(nodes) == 1 else "",
            "POWERGUARD_NODES": ",".join(nodes),
            **trace_env(),
        }
        out = await run(argv, timeout_s=self.opts.timeout_s, env=env, what=f"{action} hook")
        return out.strip().splitlines()[-1] if out.strip() else f"{action} hook ok"

    async def prepare_shutdown(self, node: str, *, saga_id: str, jobs: Sequence[str]) -> str:
        parts = [await self._hook("drain", self.opts.drain, saga_id=saga_id, nodes=[node])]
        parts += [await self.stop_job(j, nodes=[node], saga_id=saga_id) for j in jobs]
        return "; ".join(parts)

    async def stop_job(self, job: str, *, nodes: Sequence[str], saga_id: str) -> str:
        return await self._hook("stop", self.opts.stop, saga_id=saga_id, job=job, nodes=nodes)

    async def start_job(self, job: str, *, nodes: Sequence[str], saga_id: str) -> str:
        return await self._hook("start", self.opts.start, saga_id=saga_id, job=job, nodes=nodes)

    async def node_restored(self, node: str, *, saga_id: str) -> None:
        await self._hook("resume", self.opts.resume, saga_id=saga_id, nodes=[node])
