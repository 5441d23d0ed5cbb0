"""Properties of a whole site: two UPS groups (A feeds n1-n3, B feeds n3-n4) that fail and
come back at random times, so sagas follow one another, join nodes and start again; acks,
device results and resumes arrive for whichever saga is open (and for ones that are not)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from powerguard.coordinator import saga
from powerguard.schemas import SagaState as S

from .harness import POLICY, TOPO
from .site import Site

power = st.tuples(
    st.just("power"),
    st.sampled_from(["A", "B"]),
    st.booleans(),
    st.one_of(st.none(), st.floats(min_value=0, max_value=1000)),
    st.booleans(),
)
acks = st.tuples(st.just("acks"), st.sampled_from(["j1", "j2", "j3"]), st.sampled_from(["ckpt", "final"]))
report = st.tuples(
    st.just("node"), st.sampled_from(sorted(TOPO.feeds)), st.sampled_from(["off", "ready"]), st.booleans()
)
resumed = st.tuples(st.just("resumed"), st.sampled_from(["j1", "j2", "j3"]), st.booleans())
fails = st.tuples(st.just("fail"), st.sampled_from(["j1", "j2", "j3"]))  # a rank's power checkpoint fails
advance = st.tuples(st.just("advance"), st.floats(min_value=0, max_value=400))
steps = st.lists(st.one_of(power, acks, report, resumed, advance, fails), min_size=1, max_size=60)


def current(s: Site) -> str | None:
    return next(iter(s.core.open), None)


def apply(s: Site, step) -> None:
    sid = current(s)
    match step:
        case ("power", ups, on_battery, runtime, lb):
            s.send(s.power(ups, on_battery, runtime_s=runtime, status=["OB" if on_battery else "OL"] + ["LB"] * lb))
        case ("acks", job, rnd):
            mine = [o for o, r in s.core.open.items() if job in r.jobs]
            if mine:  # the power round's current attempt (ckpt, ckpt.2, ...) or the final
                rounds = {
                    o: rnd if rnd == "final" else s.core.open[o].jobs[job].request_id.rsplit("/", 1)[1] for o in mine
                }
                s.send(*[a for o in mine for a in s.acks(o, job, round=rounds[o])])
        case ("fail", job):
            mine = [o for o, r in s.core.open.items() if job in r.jobs]
            s.send(*[s.failed(o, job, 0, s.core.open[o].jobs[job].request_id) for o in mine])
        case ("node", node, state, ours):
            mine = [o for o, r in s.core.open.items() if node in r.nodes] or [sid]
            s.send(*[s.node(node, state, o if ours else "s999") for o in mine])
        case ("resumed", job, ours):
            mine = [o for o, r in s.core.open.items() if job in r.jobs or job in r.carried] or [sid]
            s.send(*[s.resumed(job, o if ours else None) for o in mine])
        case ("advance", dt):
            s.advance(dt)


def check(s: Site, step, held_before: dict[str, set[str]]) -> None:
    """After every input: every node at risk is held by exactly one open saga, at most one saga
    protects (is before its shutdown), a protected node's jobs were all asked to checkpoint, and
    no node is shut down twice for one reading nor by a saga while another holds it."""
    protecting = [r for r in s.core.open.values() if r.state.before_shutdown]
    assert len(protecting) <= 1, "two sagas protecting one site"
    held = {sid: saga.held_by(r) for sid, r in s.core.open.items()}
    owners: dict[str, list[str]] = {}
    for sid, nodes in held.items():
        for n in nodes:
            owners.setdefault(n, []).append(sid)
    assert all(len(v) == 1 for v in owners.values()), f"a node held by two sagas: {owners}"
    on_battery = [u for u, v in s.core.ups.items() if v.on_battery]
    jobs = s.core.registry.jobs(s.now)
    for node in TOPO.nodes_at_risk(on_battery):
        assert node in owners, f"{node} at risk and no saga holds it: unprotected"
        rec = s.core.open[owners[node][0]]
        if rec.state.before_shutdown:
            for name, info in jobs.items():
                if node in info.nodes:
                    assert name in rec.jobs and rec.jobs[name].requested_at is not None, f"{name} on {node} not asked"
    for rec in s.core.open.values():
        for name, plan in rec.jobs.items():
            assert plan.attempt <= s.policy.ckpt_retries + 1, f"{name} retried past ckpt_retries"
    for cmds in step.commands.values():
        for c in cmds:
            if c.kind == "ckpt_request" and c.args["deadline"] is not None:
                assert c.args["deadline"] <= s.now + s.policy.ckpt_timeout_s + 1e-6, "a deadline past the budget"
    targets = [c.target for cmds in step.commands.values() for c in cmds if c.kind == "shutdown"]
    assert len(targets) == len(set(targets)), f"a node shut down twice for one input: {targets}"
    for sid, cmds in step.commands.items():
        if not cmds:
            continue
        rec = next(r for r in step.changed if r.saga_id == sid)
        for c in cmds:
            assert c.key.startswith(f"{sid}/"), "a command keyed outside its saga"
            if c.kind == "shutdown":
                others = [o for o, nodes in held_before.items() if o != sid and c.target in nodes]
                assert not others, f"{c.target} shut down by {sid} while {others} held it"
                assert all(s.core.ups[u].on_battery for u in TOPO.feeds[c.target]), f"{c.target} off with mains"
                unsettled = [j for j, p in rec.jobs.items() if c.target in p.ranks.values() and p.settled_at is None]
                assert not unsettled, f"{c.target} off before {unsettled} checkpointed or ran out of time"


def drain(s: Site) -> None:
    """Mains back for good; every device and agent does what it is told."""
    s.send(s.power("A", False, charge_pct=100), s.power("B", False, charge_pct=100))
    for _ in range(6):
        if not s.core.open:
            return
        for sid, rec in list(s.core.open.items()):
            s.send(*[s.node(n, "off", sid) for n, p in rec.nodes.items() if p.shutdown_at is not None])
        s.advance(s.policy.restore_stable_s + 1)
        for sid, rec in list(s.core.open.items()):
            s.send(*[s.node(n, "ready", sid) for n, p in rec.nodes.items() if p.power_on_at is not None])
        for sid, rec in list(s.core.open.items()):
            s.send(*[s.resumed(j, sid) for j in sorted({*rec.jobs, *rec.carried})])
        s.advance(1)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps, st.sampled_from(["checkpoint-at-stop", "pause", "continue"]))
def test_site_invariants(steps_, hold_policy):
    s = Site(policy=POLICY.model_copy(update={"hold_policy": hold_policy}))
    for step in steps_:
        seen = len(s.steps)
        held_before = {sid: saga.held_by(r) for sid, r in s.core.open.items()}
        apply(s, step)
        for out in s.steps[seen:]:
            check(s, out, held_before)
    drain(s)
    assert not s.core.open, f"a saga is stuck: {[(r.saga_id, r.state.value) for r in s.core.open.values()]}"
    keys = [c.key for c in s.commands]
    assert len(keys) == len(set(keys)), "a command was issued twice"
    ended = {}
    for st_ in s.steps:
        for rec in st_.changed:
            ended[rec.saga_id] = rec
    for sid, rec in ended.items():
        assert rec.terminal
        mine = [c for c in s.commands if c.key.startswith(f"{sid}/")]
        shut = {c.target for c in mine if c.kind == "shutdown"}
        on = {c.target for c in mine if c.kind == "power_on"}
        assert shut <= on or rec.state == S.FAILED, f"saga {sid} left {shut - on} off"
    last: dict[str, str] = {}  # a node's last power command over every saga: never left off
    for c in s.commands:
        if c.kind in ("shutdown", "power_on"):
            last[c.target] = c.kind
    assert all(k == "power_on" for k in last.values()), f"nodes left off: {last}"
