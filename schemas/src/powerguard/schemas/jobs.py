"""Job lifecycle: ``pg.job.<job>``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .envelope import Data, Envelope
from .subjects import Subjects


class JobData(Data):
    job: str
    saga_id: str | None = None
    idempotency_key: str | None = None
    nodes: list[str] = Field(default_factory=list)
    rank: int | None = Field(default=None, ge=0)
    step: int | None = Field(default=None, ge=0, description="For resumed: step restored from")
    detail: str | None = None
    dry_run: bool = Field(default=False, description="A drill: report what would be done, do nothing")


class JobEvent(Envelope):
    data: JobData
    SUBJECT_TEMPLATE = "{prefix}.job.{job}"

    def nats_subject(self, subjects: Subjects) -> str:
        return subjects.job(self.data.job)


class JobStopRequested(JobEvent):
    type: Literal["io.powerguard.job.v1.stop_requested"] = "io.powerguard.job.v1.stop_requested"


class JobStopped(JobEvent):
    type: Literal["io.powerguard.job.v1.stopped"] = "io.powerguard.job.v1.stopped"


class JobRestartRequested(JobEvent):
    type: Literal["io.powerguard.job.v1.restart_requested"] = "io.powerguard.job.v1.restart_requested"


class JobRestarted(JobEvent):
    type: Literal["io.powerguard.job.v1.restarted"] = "io.powerguard.job.v1.restarted"


class JobResumed(JobEvent):
    """A rank (or the job) took its first training step after restoring ``step``."""

    type: Literal["io.powerguard.job.v1.resumed"] = "io.powerguard.job.v1.resumed"
