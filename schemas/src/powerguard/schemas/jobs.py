"""Job lifecycle: commands ``pg.cmd.job.<job>`` (coordinator), results ``pg.result.job.<job>``
(power-control), ``pg.ckpt.<job>.resumed`` (the job's own ckpt-agent)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .envelope import Data, Envelope
from .subjects import Subjects


class JobData(Data):
    job: str
    saga_id: str | None = None
    idempotency_key: str | None = None
    nodes: list[str] = Field(default_factory=list, max_length=100_000)
    rank: int | None = Field(default=None, ge=0)
    step: int | None = Field(default=None, ge=0, description="For resumed: step restored from")
    detail: str | None = None
    dry_run: bool = Field(default=False, description="A drill: report what would be done, do nothing")


class JobEvent(Envelope):
    data: JobData


class JobCommand(JobEvent):
    SUBJECT_TEMPLATE = "{prefix}.cmd.job.{job}"

    def nats_subject(self, subjects: Subjects) -> str:
        return subjects.job_cmd(self.data.job)


class JobResult(JobEvent):
    SUBJECT_TEMPLATE = "{prefix}.result.job.{job}"

    def nats_subject(self, subjects: Subjects) -> str:
        return subjects.job_result(self.data.job)


class JobStopRequested(JobCommand):
    type: Literal["io.powerguard.job.v1.stop_requested"] = "io.powerguard.job.v1.stop_requested"


class JobStopped(JobResult):
    type: Literal["io.powerguard.job.v1.stopped"] = "io.powerguard.job.v1.stopped"


class JobRestartRequested(JobCommand):
    type: Literal["io.powerguard.job.v1.restart_requested"] = "io.powerguard.job.v1.restart_requested"


class JobRestarted(JobResult):
    type: Literal["io.powerguard.job.v1.restarted"] = "io.powerguard.job.v1.restarted"


class JobResumed(JobEvent):
    """A rank (or the job) took its first training step after restoring ``step``."""

    type: Literal["io.powerguard.job.v1.resumed"] = "io.powerguard.job.v1.resumed"
    SUBJECT_TEMPLATE = "{prefix}.ckpt.{job}.resumed"

    def nats_subject(self, subjects: Subjects) -> str:
        return subjects.job_resumed(self.data.job)
