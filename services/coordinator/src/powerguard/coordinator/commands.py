"""The saga's commands, each built by one function for its first send and every re-send
(:func:`pending`, what a restarted coordinator sends again), so the two never differ. Every
command carries an idempotency key ``<saga>/<node|job>/<action>``."""

from __future__ import annotations

from typing import Any, Literal

from powerguard.schemas import SagaState, command_key

from .inputs import Command, CommandKind
from .policy import Policy
from .record import JobPlan, SagaRecord

S = SagaState


def round_action(attempt: int) -> str:
    return "ckpt" if attempt == 1 else f"ckpt.{attempt}"


def simple(rec: SagaRecord, kind: CommandKind, target: str, action: str, **args: Any) -> Command:
    """A command with its arguments as given (``release``, ``ckpt_recorded``)."""
    return Command(kind=kind, key=command_key(rec.saga_id, target, action), target=target, args=args)


def ckpt_command(rec: SagaRecord, plan: JobPlan, *, final: bool, policy: Policy) -> Command:
    """The checkpoint request of a job's power (or final) round."""
    rnd = plan.final if final else plan
    assert rnd is not None
    then = "pause" if final or plan.hold_policy == "pause" else "continue"
    return Command(
        kind="ckpt_request",
        key=command_key(rec.saga_id, plan.job, "final" if final else round_action(plan.attempt)),
        target=plan.job,
        args={
            "request_id": rnd.request_id,
            "deadline": rnd.deadline,
            "reason": "final" if final else "power",
            "then": then,
            "pause_max_s": policy.pause_max_s if then == "pause" else None,
        },
    )


def hold_command(rec: SagaRecord, plan: JobPlan) -> Command:
    """The request of a job's latest hold checkpoint (training goes on after it)."""
    h = plan.hold
    assert h is not None
    return Command(
        kind="ckpt_request",
        key=command_key(rec.saga_id, plan.job, f"hold.{plan.hold_rounds}"),
        target=plan.job,
        args={"request_id": h.request_id, "deadline": h.deadline, "reason": "hold", "then": "continue"},
    )


def job_command(rec: SagaRecord, kind: Literal["job_stop", "job_restart"], job: str) -> Command:
    """The stop or restart of a job on all its nodes."""
    action = "stop" if kind == "job_stop" else "restart"
    nodes = sorted(set((rec.jobs.get(job) or rec.carried[job]).ranks.values()))
    return Command(kind=kind, key=command_key(rec.saga_id, job, action), target=job, args={"nodes": nodes})


def node_command(
    rec: SagaRecord, kind: Literal["shutdown", "power_on"], node: str, by_node: dict[str, list[str]] | None = None
) -> Command:
    """A node's shutdown (with its jobs and the saga's reason) or power-on."""
    key = command_key(rec.saga_id, node, kind)
    if kind == "power_on":
        return Command(kind=kind, key=key, target=node)
    jobs = (by_node if by_node is not None else rec.jobs_by_node()).get(node, [])
    args: dict[str, Any] = {"jobs": jobs, "reason": rec.shutdown_reason}
    retry = rec.nodes[node].off_retry if node in rec.nodes else None
    if retry:  # the off failed before: a new key, and power-control may fall back to the outlets
        key, args["retry"] = f"{key}.r{retry}", retry
    return Command(kind=kind, key=key, target=node, args=args)


def ups_command(rec: SagaRecord, ups: str) -> Command:
    told = rec.ups_off[ups]
    key = command_key(rec.saga_id, f"ups:{ups}", "output_off")
    args = {"delay_s": told.delay_s, "reason": told.reason, "nodes": told.nodes}
    return Command(kind="ups_off", key=key, target=ups, args=args)


def restartable(rec: SagaRecord) -> list[tuple[str, JobPlan]]:
    """The jobs this saga restarts: its own (but those that kept running through a power return
    before the shutdown) and those carried from a saga it superseded."""
    return sorted((k, p) for k, p in {**rec.carried, **rec.jobs}.items() if not p.kept_running)


def pending(rec: SagaRecord, policy: Policy) -> list[Command]:
    """Commands of the current phase whose result has not arrived: what a restarted
    coordinator sends again (receivers deduplicate by idempotency key)."""
    out: list[Command] = []
    if rec.state.checkpoint_deadline:
        for _, p in sorted(rec.jobs.items()):
            if p.requested_at is not None and p.settled_at is None:
                out.append(ckpt_command(rec, p, final=False, policy=policy))
            if p.final is not None and p.final.settled_at is None:
                out.append(ckpt_command(rec, p, final=True, policy=policy))
    elif rec.state == S.HOLDING:
        out += [hold_command(rec, p) for _, p in sorted(rec.jobs.items()) if p.hold and p.hold.settled_at is None]
    elif rec.state == S.SHUTTING_DOWN:
        for name in sorted(rec.jobs):
            if command_key(rec.saga_id, name, "stop") in rec.issued:
                out.append(job_command(rec, "job_stop", name))
        by_node = rec.jobs_by_node()
        for node, p in sorted(rec.nodes.items()):
            if p.shutdown_at is not None and p.off_at is None:
                out.append(node_command(rec, "shutdown", node, by_node))
    if rec.state.down:
        out += [ups_command(rec, u) for u, t in sorted(rec.ups_off.items()) if t.done_at is None and t.error is None]
        by_node = rec.jobs_by_node()
        for node, p in sorted(rec.nodes.items()):  # the last stage's loads (and any off not reported)
            if p.shutdown_at is not None and p.off_at is None:
                out.append(node_command(rec, "shutdown", node, by_node))
    elif rec.state == S.RESTORING:
        for node, p in sorted(rec.nodes.items()):
            if p.power_on_at is not None and p.ready_at is None:
                out.append(node_command(rec, "power_on", node))
        for name, p in restartable(rec):
            if p.restart_at is not None and p.resumed_at is None:
                out.append(job_command(rec, "job_restart", name))
    return out
