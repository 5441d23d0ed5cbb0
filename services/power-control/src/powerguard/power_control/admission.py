"""Whether power-control runs a command: a pure rule over the command, what the coordinator
last said of its saga, and the clock.

Only the coordinator may publish on the command subjects (server permissions) and the
consumer checked each command's subject; this refuses what a valid command can still be
wrong about: a replay or a backlog (too old), a node or UPS not in the site file, a saga the
coordinator never announced, a shutdown or a job stop whose saga has moved on (a command left
running by a previous power-control, resumed at start, or one it never acked, delivered again
after the ack wait: a stop that late would kill the job the saga just restarted), a job
restart once its saga has resumed its jobs or ended without a restore, a UPS's output cut
outside the saga's "down".

The saga's state is the one on its newest ``saga.state_changed`` event (``pg.saga.<id>``,
which only the coordinator may publish): the services meet on the bus, never in each
other's KV records.
"""

from __future__ import annotations

from collections.abc import Container

from powerguard.schemas import (
    Envelope,
    JobRestartRequested,
    JobStopRequested,
    PowerOnRequested,
    SagaState,
    ShutdownRequested,
    UpsOutputOffRequested,
)

NO_SAGA = "no-saga"  # ``saga`` when the coordinator never announced the command's saga


def refusal(
    event: Envelope,
    *,
    now: float,
    max_age_s: float,
    nodes: Container[str],
    ups: Container[str],
    saga: SagaState | str | None = None,
) -> str | None:
    """Why ``event`` must not run (None: run it). ``saga``: the state its saga was last
    announced in, :data:`NO_SAGA` when never, None when the site does not ask for one
    (``require_saga: false``)."""
    d = event.data
    age = now - event.time.timestamp()
    if age > max_age_s:
        return f"command is {age:.0f}s old (max_command_age_s {max_age_s:.0f})"
    if isinstance(event, ShutdownRequested | PowerOnRequested) and d.node not in nodes:
        return f"node {d.node!r} is not in the site file"
    if isinstance(event, UpsOutputOffRequested) and d.ups not in ups:
        return f"UPS {d.ups!r} is not in the site file"
    if saga is None:
        return None
    if saga == NO_SAGA:
        return f"saga {d.saga_id!r} was never announced by the coordinator"
    state = SagaState(saga)
    if isinstance(event, ShutdownRequested) and state.after_shutdown:
        return f"saga {d.saga_id} is {state}: a shutdown of {d.node} is over"
    if isinstance(event, JobStopRequested) and state.after_shutdown:
        return f"saga {d.saga_id} is {state}: its stop of job {d.job} is over (the job may be running again)"
    if isinstance(event, JobRestartRequested) and state.restarts_nothing:
        return f"saga {d.saga_id} is {state}: it restarts no job any more (a late restart of {d.job})"
    if isinstance(event, UpsOutputOffRequested) and not state.down:
        return f"saga {d.saga_id} is {state}: a UPS's output is cut only while its saga is down"
    return None


def may_be_stale(event: Envelope, saga: SagaState | str) -> bool:
    """Could a newer announcement of the saga admit ``event``, refused on ``saga``?

    A replica a moment behind the leader only ever shows an *older* state, and a saga's states
    only move forward (never back before its shutdown, never out of "down" back into it). So
    only "never announced" and a UPS cut refused before its saga was down can be a stale
    answer worth reading again; a shutdown refused because its saga moved on stands."""
    if saga == NO_SAGA:
        return True
    state = SagaState(saga)
    return isinstance(event, UpsOutputOffRequested) and (state.before_shutdown or state == SagaState.SHUTTING_DOWN)
