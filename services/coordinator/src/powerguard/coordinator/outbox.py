"""Saga commands and state changes as events. Ids are deterministic per saga (a re-send is
deduplicated) but keyed with the saga's own secret (stored in its record, which agents cannot
read): nobody else can publish an id first and have the real command dropped as a duplicate."""

from __future__ import annotations

from datetime import UTC, datetime

from powerguard.schemas import (
    CheckpointRecorded,
    CheckpointRequestData,
    CheckpointRequested,
    Envelope,
    HoldReleased,
    JobData,
    JobRestartRequested,
    JobStopRequested,
    PowerCommandData,
    PowerOnRequested,
    RecordedData,
    ReleaseData,
    SagaData,
    SagaStateChanged,
    ShutdownRequested,
    UpsOutputCommandData,
    UpsOutputOffRequested,
    deterministic_id,
)

from .figures import lost_steps
from .inputs import Command
from .record import SagaRecord

SOURCE = "/powerguard/coordinator"


def _dt(t: float | None) -> datetime | None:
    return datetime.fromtimestamp(t, UTC) if t is not None else None


_JOB_COMMANDS = {"job_stop": JobStopRequested, "job_restart": JobRestartRequested}
_POWER_COMMANDS = {"shutdown": ShutdownRequested, "power_on": PowerOnRequested}


def command_event(rec: SagaRecord, cmd: Command) -> Envelope:
    eid = deterministic_id("cmd", cmd.key, secret=rec.id_secret)
    a = cmd.args
    if cmd.kind == "ckpt_request":
        return CheckpointRequested(
            id=eid,
            source=SOURCE,
            data=CheckpointRequestData(
                request_id=a["request_id"],
                saga_id=rec.saga_id,
                job=cmd.target,
                reason=a.get("reason", "power"),
                deadline=_dt(a["deadline"]),
                then=a.get("then", "continue"),
                pause_max_s=a.get("pause_max_s"),
                acks="job",  # rank 0 acks for the job: one message, not one per rank (facts.ack)
            ),
        )
    if cmd.kind == "release":
        return HoldReleased(id=eid, source=SOURCE, data=ReleaseData(job=cmd.target, saga_id=rec.saga_id))
    if cmd.kind == "ckpt_recorded":
        data = RecordedData(job=cmd.target, saga_id=rec.saga_id, step=a["step"], commit=a.get("commit"))
        return CheckpointRecorded(id=eid, source=SOURCE, data=data)
    # a drill's saga sends every power and job command as dry-run
    if cmd.kind in _JOB_COMMANDS:
        data = JobData(
            job=cmd.target, saga_id=rec.saga_id, idempotency_key=cmd.key, nodes=a.get("nodes", []), dry_run=rec.drill
        )
        return _JOB_COMMANDS[cmd.kind](id=eid, source=SOURCE, data=data)
    if cmd.kind in _POWER_COMMANDS:
        data = PowerCommandData(
            saga_id=rec.saga_id,
            node=cmd.target,
            idempotency_key=cmd.key,
            reason=a.get("reason") if cmd.kind == "shutdown" else "power restored",
            jobs=a.get("jobs", []),
            dry_run=rec.drill,
            retry=a.get("retry", 0),
        )
        return _POWER_COMMANDS[cmd.kind](id=eid, source=SOURCE, data=data)
    if cmd.kind == "ups_off":
        data = UpsOutputCommandData(
            saga_id=rec.saga_id,
            ups=cmd.target,
            idempotency_key=cmd.key,
            delay_s=a["delay_s"],
            reason=a.get("reason"),
            nodes=a.get("nodes", []),
            dry_run=rec.drill,
        )
        return UpsOutputOffRequested(id=eid, source=SOURCE, data=data)
    raise ValueError(f"unknown command kind {cmd.kind}")


def state_events(rec: SagaRecord, since: int) -> list[SagaStateChanged]:
    """One event per transition from index ``since`` on."""
    out = []
    acked = {j: p.missing for j, p in rec.jobs.items() if p.missing and p.settled_at is not None}
    for i in range(since, len(rec.history)):
        t = rec.history[i]
        out.append(
            SagaStateChanged(
                id=deterministic_id("saga", rec.saga_id, i, secret=rec.id_secret),
                source=SOURCE,
                time=_dt(t.at),
                data=SagaData(
                    saga_id=rec.saga_id,
                    site=rec.site,
                    ups=rec.on_battery,
                    state=t.state,
                    previous=rec.history[i - 1].state if i else None,
                    reason=t.reason,
                    jobs=sorted(rec.jobs),
                    nodes=sorted(rec.nodes),
                    missing_ranks=acked,
                    deadline=_dt(rec.deadline),
                    lost_steps={j: n for j, p in sorted(rec.jobs.items()) if (n := lost_steps(p, rec)) is not None},
                    drill=rec.drill,
                ),
            )
        )
    return out
