"""Property-based tests: random power events, acks, reports and clock advances, coordinator
restarts (the ranks known only from the agents' bucket, not heard since) and ranks heard."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from powerguard.coordinator import budget, commands, inputs, record
from powerguard.coordinator.topology import AgentRegistry

from .harness import POLICY, TOPO, Drive

power = st.tuples(
    st.just("power"),
    st.sampled_from(["A", "B"]),
    st.booleans(),
    st.one_of(st.none(), st.floats(min_value=0, max_value=1000)),
    st.booleans(),
)
ack = st.tuples(
    st.just("ack"),
    st.sampled_from(["j1", "j2", "j3"]),
    st.integers(0, 4),
    st.booleans(),
    st.sampled_from(["ckpt", "final"]),
)
report = st.tuples(
    st.just("node"), st.sampled_from(sorted(TOPO.feeds)), st.sampled_from(["off", "ready", "failed_off"])
)
resumed = st.tuples(st.just("resumed"), st.sampled_from(["j1", "j2", "j3"]))
advance = st.tuples(st.just("advance"), st.floats(min_value=0, max_value=400))
restart = st.tuples(st.just("restart"))  # a new coordinator: every rank known from the bucket, none heard
hear = st.tuples(st.just("hear"), st.sampled_from(["j1", "j2", "j3"]))  # a rank's heartbeat arrives
steps = st.lists(st.one_of(power, ack, report, resumed, advance, restart, hear), min_size=1, max_size=40)


def restarted(reg: AgentRegistry) -> AgentRegistry:
    fresh = AgentRegistry()
    for job in ("j1", "j2", "j3"):
        for agent in reg.agents(job):
            fresh.update(agent, heard=False)
    return fresh


def apply(d: Drive, step) -> list[inputs.Command]:
    match step:
        case ("power", ups, on_battery, runtime, lb):
            return d.power(ups, on_battery, runtime_s=runtime, low_battery=lb)
        case ("ack", job, rank, ok, rnd):
            return d.ack(job, rank, ok=ok, request_id=f"s1/{job}/{rnd}") if d.rec else []
        case ("node", node, state):
            return d.node(node, state) if d.rec else []
        case ("resumed", job):
            return d.resumed(job) if d.rec else []
        case ("advance", dt):
            return d.advance(dt) if d.rec else []
        case ("restart",):
            d.reg = restarted(d.reg)
            return []
        case ("hear", job):
            for agent in d.reg.agents(job):
                d.reg.update(agent, d.now)
            return []
    raise AssertionError(step)


def check_commands(d: Drive, cmds: list[inputs.Command]) -> None:
    if d.rec is not None and d.state == "cancelled" and not getattr(d, "cancel_checked", False):
        d.cancel_checked = True  # the input that ended it: the registry as the saga saw it
        live = d.reg.jobs()
        since = d.rec.back_before_shutdown_at
        unheard = [j for j in d.rec.jobs if j in live and live[j].heard_at < since]
        assert not unheard, f"cancelled with {unheard} not heard from since power returned (dead with the power?)"
    for c in cmds:
        if c.kind == "shutdown":
            feeds = TOPO.feeds[c.target]
            assert all(d.ups[u].on_battery for u in feeds), f"shutdown of {c.target} with an on-line feed"
            unsettled = [j for j, p in d.rec.jobs.items() if p.settled_at is None]
            assert not unsettled, f"shutdown before {unsettled} acked or hit the deadline"
            finals = [j for j, p in d.rec.jobs.items() if p.final is not None and p.final.settled_at is None]
            assert not finals, f"shutdown before the final checkpoint of {finals} settled"
        if c.kind == "ckpt_request" and c.args["reason"] == "final":
            plan = d.rec.jobs[c.target]
            assert plan.hold_policy == "checkpoint-at-stop" and c.args["then"] == "pause"
            # the budget rule (budget.py): the battery's time left less the shutdown's need and the margin
            budget_end = d.now + budget.budget_s(d.rec.supply, d.topo, d.policy)
            assert c.args["deadline"] <= budget_end, "a final checkpoint may not eat into the shutdown reserve"
        if c.kind == "release":
            back = d.rec.back_before_shutdown_at is not None  # power back before any shutdown: released at once
            assert (back or d.state in ("cancelled", "done")) and d.rec.jobs[c.target].paused
        if c.kind == "job_restart" and not any(x.kind == "shutdown" for x in d.commands):
            # no node went down: a job is restarted only when it has not been heard since power returned
            heard = d.reg.jobs().get(c.target)
            since = d.rec.back_before_shutdown_at
            assert since is not None and heard is not None and heard.heard_at < since, (c.target, heard, since)


def drain(d: Drive) -> None:
    """Power comes back for good and every device does what it is told."""
    for ups in ("A", "B"):
        check_commands(d, d.power(ups, False, charge_pct=100))
    for _ in range(3):
        for node, plan in d.rec.nodes.items():
            if plan.shutdown_at is not None:
                check_commands(d, d.node(node, "off"))
        check_commands(d, d.advance(d.policy.restore_stable_s + 1))
        for node, plan in d.rec.nodes.items():
            if plan.power_on_at is not None:
                check_commands(d, d.node(node, "ready"))
        for job in d.rec.jobs:
            check_commands(d, d.resumed(job))
        check_commands(d, d.advance(1))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps, st.sampled_from(["checkpoint-at-stop", "pause", "continue"]))
def test_saga_invariants(steps_, hold_policy):
    d = Drive(policy=POLICY.model_copy(update={"hold_policy": hold_policy}))
    for step in steps_:
        cmds = apply(d, step)
        check_commands(d, cmds)
        if d.rec is not None:
            assert apply(d, step) == [] if step[0] != "advance" else True  # replay: nothing new
    if d.rec is None:
        return
    drain(d)
    assert d.rec.terminal, f"saga stuck in {d.state}: {d.rec.reason}"
    keys = [c.key for c in d.commands]
    assert len(keys) == len(set(keys)), "a command was issued twice"
    shut = {c.target for c in d.commands if c.kind == "shutdown"}
    powered = {c.target for c in d.commands if c.kind == "power_on"}
    assert shut <= powered, f"nodes left off: {shut - powered}"
    restarted_jobs = {c.target for c in d.commands if c.kind == "job_restart"}
    if d.state == "cancelled":
        assert not shut and not restarted_jobs
        released = {c.target for c in d.commands if c.kind == "release"}
        assert released == {j for j, p in d.rec.jobs.items() if p.paused}, "a paused job was never released"
    stopped = [p for p in d.rec.jobs.values() if p.stopped_at is not None]
    for p in stopped:  # the figures never hide a loss: the stop step is at least what was made durable
        assert p.stop_step is None or p.durable_step is None or p.stop_step >= p.durable_step
    # after a restart from the stored record, nothing that was done is sent again
    back = record.SagaRecord.model_validate_json(d.rec.model_dump_json())
    assert commands.pending(back, d.policy) == []
