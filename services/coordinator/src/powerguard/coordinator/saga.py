"""The outage saga as a pure state machine: inputs and a clock in, commands out. No I/O.

    detected -> checkpointing -> checkpointed | partial -> holding [-> final_checkpoint]
             -> shutting_down -> down | partly_down -> restoring -> resumed -> done
    exits: cancelled (power back before shutdown), failed (with a reason)

Down on battery with ``ups_off`` allowed, each UPS that fed the saga's nodes is told to cut its
output and return once :mod:`.killpower` says it may (everything it alone feeds off, every job
there durable, its runtime short or the site limit reached: the command ``ups_off``); the
restore then waits until the UPS has had time to cycle its output (``ups_off_return_s``).

A power checkpoint that failed is requested again as a new round (its own request id and
command key, ``ckpt.2``, ...) up to ``ckpt_retries`` times while the battery budget allows; a
node whose power-off failed is commanded off again (``shutdown.r1``) up to ``off_retries`` times,
and a shutdown where some node's off failed ends ``partly_down``, naming the nodes, never ``down``.

The battery budget is the time left until the battery is empty (the most conservative of the
UPS's estimate, the measured discharge and the site file's capacity: :mod:`.battery`) minus
what the shutdown needs (the node groups' measured shutdowns of earlier real outages times
``shutdown_factor``, or ``shutdown_reserve_s`` for a group never measured) minus ``margin_s``.
The hold ends on the configured reserve; the final checkpoint is taken whenever it fits the
budget, even below the reserve.

Protection never pauses: the site core (:mod:`.core`) keeps at most one saga *protecting*
nodes (before its shutdown) and passes every saga the nodes the others hold (``held``), so a
node is shut down by one saga only; a restoring saga whose nodes or jobs are at risk again is
superseded by the protecting one (:func:`supersede`), which carries its unfinished restore.

The hold policy of each job (site default, overridden by the job's registration) decides what
its ranks do during the hold: ``checkpoint-at-stop`` jobs train on and take a final checkpoint
at one step when the shutdown is decided (state ``final_checkpoint``, within what the battery
leaves before the shutdown reserve), then wait there until they are stopped; ``pause`` jobs wait
at the step boundary after their power checkpoint until a release (power back) or the stop;
``continue`` jobs train on and lose what they train after the checkpoint. The record keeps the
honest figures (:mod:`.figures`): the step each job stopped at, what was durable then, the hold.

:func:`handle` applies one input to a :class:`SagaRecord` (which is what the coordinator
stores in KV) and returns the commands it implies. Every command carries an idempotency key
(``<saga>/<node|job>/<action>``) and is issued at most once per saga; :func:`pending`
re-derives what a restarted coordinator must send again.

Where things are: this file is the entry (:func:`start`, :func:`handle`, and what the site core
asks of sagas); the input vocabulary is in :mod:`.inputs`, the record in :mod:`.record`, what
each input tells the record in :mod:`.facts`, one handler per state in :mod:`.states` (the
table :data:`states.HANDLERS`), the checkpoint rounds in :mod:`.rounds`, the commands and
:func:`commands.pending` in :mod:`.commands`, the battery rules in :mod:`.budget`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from powerguard.schemas import HoldPolicy, SagaState, command_key

from . import budget as rules
from . import facts, states
from .commands import simple
from .inputs import Ack, Command, Input, Power
from .policy import Policy
from .record import JobPlan, NodePlan, SagaRecord, Transition, UpsView
from .rounds import record_durable
from .topology import JobInfo, Topology
from .turn import JobsArg, Turn, emit, set_state

S = SagaState
MAX_STEPS = 16  # a bounded number of state steps per input; each step changes state or stops


def start(
    *,
    saga_id: str,
    topo: Topology,
    ups: dict[str, UpsView],
    jobs: dict[str, JobInfo],
    now: float,
    trace: tuple[str, str] | None = None,
    hold_policy: HoldPolicy = "checkpoint-at-stop",
    held: frozenset[str] = frozenset(),
    shutdown_need: dict[str, float] | None = None,
    drill: bool = False,
) -> SagaRecord:
    """A new saga for the nodes at risk now that no other saga holds (``held``; call only when
    some node is at risk). ``shutdown_need``: the node groups' measured shutdowns so far.
    ``drill``: the views are a drill's (``powerguard drill``): every power and job command of
    the saga is dry-run, for its whole life.

    ``trace`` is (trace id, span id) of the event that started it: the outage joins that trace."""
    rec = SagaRecord(
        saga_id=saga_id,
        site=topo.site,
        created_at=now,
        updated_at=now,
        ups={u: v.model_copy(deep=True) for u, v in ups.items()},
        shutdown_need=dict(shutdown_need or {}),
    )
    if trace is not None:
        rec.trace_id, rec.parent_span_id = trace
    rec.history.append(Transition(state=S.DETECTED, at=now, reason=f"on battery: {', '.join(rec.on_battery)}"))
    rec.at_risk = [n for n in topo.nodes_at_risk(rec.on_battery) if n not in held]
    rec.drill = drill
    _join(rec, rec.at_risk, jobs, hold_policy)
    return rec


def handle(
    rec: SagaRecord,
    inputs: Input | Sequence[Input],
    *,
    now: float,
    topo: Topology,
    policy: Policy,
    jobs: JobsArg = None,
    held: frozenset[str] = frozenset(),
    ended: set[str] | Callable[[], set[str]] | None = None,
) -> list[Command]:
    """Apply one input (or a batch of inputs, then advance once); return the new commands,
    never one already issued in this saga.

    ``jobs`` (the current agent registry, or a function returning it, called only when needed)
    lets nodes that become at risk mid-saga join it; ``held``: nodes other open sagas hold
    (never joined by this one); ``ended``: the jobs whose every rank deregistered (or a function
    returning them): a job of the saga absent from the registry and not among them is silent.
    """
    if rec.terminal:
        return []
    t = Turn(rec, now, topo, policy, jobs, ended=ended)
    require = policy.require_durability
    for inp in inputs if isinstance(inputs, Sequence) else (inputs,):
        if isinstance(inp, Power):
            facts.power(rec, inp, now)
            _settle(t, held)  # power readings count one by one, in order
            if rec.terminal:  # (only a settle changes the state: facts never do)
                break
        elif isinstance(inp, Ack):
            facts.ack(rec, inp, now, require)  # 100,000 of them in a large outage: straight to their rule
        else:
            facts.apply(rec, inp, now, require=require)
    _settle(t, held)
    rec.updated_at = now
    return t.out


def _settle(t: Turn, held: frozenset[str]) -> None:
    rec = t.rec
    if rec.state.before_shutdown:
        risk = [n for n in t.topo.nodes_at_risk(rec.on_battery) if n not in held]
        new_nodes = [n for n in risk if n not in rec.nodes]
        rec.at_risk = risk
        if new_nodes and t.jobs is not None:
            _join(rec, new_nodes, t.jobs() if callable(t.jobs) else t.jobs, t.policy.hold_policy)
    record_durable(t)  # before the commands this input leads to (a job stop, then its restart)
    for _ in range(MAX_STEPS):
        before = rec.state
        states.step(t)
        if rec.state == before:
            break
    record_durable(t)  # a round the advance settled


def _join(rec: SagaRecord, nodes: list[str], jobs: dict[str, JobInfo], default_policy: HoldPolicy) -> None:
    for n in nodes:
        rec.nodes.setdefault(n, NodePlan(node=n))
    for name, info in sorted(jobs.items()):
        if name in rec.jobs or not (info.nodes & set(nodes)):
            continue
        rec.jobs[name] = JobPlan(
            job=name,
            world_size=info.world_size,
            ranks=dict(info.ranks),
            step_at_detection=info.step,
            request_id=command_key(rec.saga_id, name, "ckpt"),
            hold_policy=info.hold_policy or default_policy,
        )


def site_need_s(rec: SagaRecord, topo: Topology, policy: Policy) -> float:
    """What one outage needs of a battery: the slowest measured power checkpoint, what the
    shutdown of the saga's nodes needs (measured, or the reserve) and the margin."""
    took = [d for p in rec.jobs.values() if (d := p.duration_s) is not None]
    groups = {topo.group_key(topo.feeds[n]) for n in rec.nodes if n in topo.feeds}
    return (max(took) if took else 0.0) + rules.groups_need_s(rec.supply, topo, policy, groups) + policy.margin_s


def give_way(drill: SagaRecord, real: SagaRecord, now: float) -> list[Command]:
    """A real outage's saga holds nodes or jobs of a drill: the drill ends ``cancelled``, its
    paused ranks released (the real saga asks them for what it needs itself; a rank leaves a
    pause only once every saga that paused it released it). Nothing the drill did was real."""
    out: list[Command] = []
    for name, plan in sorted(drill.jobs.items()):
        if plan.paused:
            emit(drill, out, simple(drill, "release", name, "release"))
    set_state(drill, S.CANCELLED, now, f"a real outage (saga {real.saga_id}) holds its nodes or jobs: the drill ends")
    drill.updated_at = now
    return out


def held_by(rec: SagaRecord) -> set[str]:
    """The nodes a saga holds: at risk before its shutdown; shut down and not yet powered on after."""
    if rec.terminal:
        return set()
    if rec.state.before_shutdown:
        return set(rec.at_risk)
    return {n for n, p in rec.nodes.items() if p.shutdown_at is not None and p.power_on_at is None}
