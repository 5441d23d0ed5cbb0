"""Docker: the job's containers (selected by label) are stopped gracefully before a
shutdown and started again after the restore, through the docker SDK."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ..errors import SchedulerError
from .base import Scheduler, job_name


class DockerOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    base_url: str | None = Field(default=None, description="Docker endpoint (default: DOCKER_HOST or the local socket)")
    job_label: str = Field(default="powerguard.job", description="Label whose value is the PowerGuard job id")
    node_label: str = Field(
        default="powerguard.node", description="Label whose value is the node the container runs on"
    )
    stop_timeout_s: int = Field(default=30, ge=0, description="SIGTERM, then SIGKILL after this long")
    timeout_s: float = Field(default=60.0, gt=0)


class DockerScheduler(Scheduler):
    kind = "docker"

    def __init__(self, options: dict) -> None:
        self.opts = DockerOptions.model_validate(options)
        self.one_stop_s = self.opts.stop_timeout_s + self.opts.timeout_s
        self._client: Any = None

    def _docker(self) -> Any:
        import docker

        if self._client is None:
            try:
                self._client = (
                    docker.DockerClient(base_url=self.opts.base_url, timeout=int(self.opts.timeout_s))
                    if self.opts.base_url
                    else docker.from_env(timeout=int(self.opts.timeout_s))
                )
            except docker.errors.DockerException as exc:
                raise SchedulerError(f"docker: cannot connect to the engine: {exc}") from None
        return self._client

    async def _call(self, what: str, fn) -> Any:
        import docker

        def blocking() -> Any:
            try:
                return fn(self._docker())
            except docker.errors.DockerException as exc:
                raise SchedulerError(f"docker: {what}: {exc}") from None

        return await asyncio.to_thread(blocking)

    def _select(self, client: Any, job: str, nodes: Sequence[str] | None) -> list[Any]:
        found = client.containers.list(all=True, filters={"label": f"{self.opts.job_label}={job_name(job)}"})
        if nodes:
            found = [c for c in found if c.labels.get(self.opts.node_label) in (None, *nodes)]
        return found

    async def stop_job(self, job: str, *, nodes: Sequence[str], saga_id: str) -> str:
        def stop(client: Any) -> list[str]:
            names = []
            for c in self._select(client, job, nodes):
                if c.status in ("running", "restarting", "paused"):
                    c.stop(timeout=self.opts.stop_timeout_s)
                    names.append(c.name)
            return names

        names = await self._call(f"stop job {job}", stop)
        return f"stopped container(s) {', '.join(names)}" if names else f"no running container of job {job}"

    async def start_job(self, job: str, *, nodes: Sequence[str], saga_id: str) -> str:
        def start(client: Any) -> list[str]:
            names = []
            for c in self._select(client, job, nodes):
                c.reload()
                if c.status != "running":
                    c.start()
                    names.append(c.name)
            return names

        names = await self._call(f"start job {job}", start)
        return f"started container(s) {', '.join(names)}" if names else f"no stopped container of job {job}"

    async def close(self) -> None:
        if self._client is not None:
            await asyncio.to_thread(self._client.close)
