"""Saga commands and state changes as events (deterministic ids: a re-send is deduplicated)."""

from __future__ import annotations

from datetime import UTC, datetime

from powerguard.schemas import (
    CheckpointRequestData,
    CheckpointRequested,
    Envelope,
    JobData,
    JobRestartRequested,
    JobStopRequested,
    PowerCommandData,
    PowerOnRequested,
    SagaData,
    SagaStateChanged,
    ShutdownRequested,
    deterministic_id,
)

from .saga import Command, SagaRecord

SOURCE = "/powerguard/coordinator"


def _dt(t: float | None) -> datetime | None:
    return datetime.fromtimestamp(t, UTC) if t is not None else None


def command_event(rec: SagaRecord, cmd: Command) -> Envelope:
    eid = deterministic_id("cmd", cmd.key)
    a = cmd.args
    match cmd.kind:
        case "ckpt_request":
            return CheckpointRequested(
                id=eid,
                source=SOURCE,
                data=CheckpointRequestData(
                    request_id=a["request_id"],
                    saga_id=rec.saga_id,
                    job=cmd.target,
                    reason="power",
                    deadline=_dt(a["deadline"]),
                ),
            )
        case "job_stop":
            return JobStopRequested(
                id=eid,
                source=SOURCE,
                data=JobData(
                    job=cmd.target,
                    saga_id=rec.saga_id,
                    idempotency_key=cmd.key,
                    nodes=a.get("nodes", []),
                    dry_run=rec.drill,
                ),
            )
        case "job_restart":
            return JobRestartRequested(
                id=eid,
                source=SOURCE,
                data=JobData(
                    job=cmd.target,
                    saga_id=rec.saga_id,
                    idempotency_key=cmd.key,
                    nodes=a.get("nodes", []),
                    dry_run=rec.drill,
                ),
            )
        case "shutdown":
            return ShutdownRequested(
                id=eid,
                source=SOURCE,
                data=PowerCommandData(
                    saga_id=rec.saga_id,
                    node=cmd.target,
                    idempotency_key=cmd.key,
                    reason=a.get("reason"),
                    jobs=a.get("jobs", []),
                    dry_run=rec.drill,
                ),
            )
        case "power_on":
            return PowerOnRequested(
                id=eid,
                source=SOURCE,
                data=PowerCommandData(
                    saga_id=rec.saga_id,
                    node=cmd.target,
                    idempotency_key=cmd.key,
                    reason="power restored",
                    dry_run=rec.drill,
                ),
            )
    raise ValueError(f"unknown command kind {cmd.kind}")


def state_events(rec: SagaRecord, since: int) -> list[SagaStateChanged]:
    """One event per transition from index ``since`` on."""
    out = []
    acked = {j: p.missing for j, p in rec.jobs.items() if p.missing and p.settled_at is not None}
    for i in range(since, len(rec.history)):
        t = rec.history[i]
        out.append(
            SagaStateChanged(
                id=deterministic_id("saga", rec.saga_id, i),
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
                ),
            )
        )
    return out
