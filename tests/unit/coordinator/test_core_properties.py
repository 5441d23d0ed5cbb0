"""Properties of a whole site: two UPS groups (A feeds n1-n3, B feeds n3-n4) that fail and
come back at random times, so sagas follow one another, join nodes and start again; acks,
device results and resumes arrive for whichever saga is open (and for ones that are not)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from powerguard.coordinator.saga import S

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
advance = st.tuples(st.just("advance"), st.floats(min_value=0, max_value=400))
steps = st.lists(st.one_of(power, acks, report, resumed, advance), min_size=1, max_size=60)


def current(s: Site) -> str | None:
    return next(iter(s.core.open), None)


def apply(s: Site, step) -> None:
    sid = current(s)
    match step:
        case ("power", ups, on_battery, runtime, lb):
            s.send(s.power(ups, on_battery, runtime_s=runtime, status=["OB" if on_battery else "OL"] + ["LB"] * lb))
        case ("acks", job, rnd):
            if sid and job in s.core.open[sid].jobs:
                s.send(*s.acks(sid, job, round=rnd))
        case ("node", node, state, ours):
            s.send(s.node(node, state, sid if ours else "s999"))
        case ("resumed", job, ours):
            s.send(s.resumed(job, sid if ours else None))
        case ("advance", dt):
            s.advance(dt)


def check(s: Site, step) -> None:
    assert len(s.core.open) <= 1, "two sagas open on one site"
    for sid, cmds in step.commands.items():
        if not cmds:
            continue
        rec = next(r for r in step.changed if r.saga_id == sid)
        for c in cmds:
            assert c.key.startswith(f"{sid}/"), "a command keyed outside its saga"
            if c.kind == "shutdown":
                assert all(s.core.ups[u].on_battery for u in TOPO.feeds[c.target]), f"{c.target} off with mains"
                unsettled = [j for j, p in rec.jobs.items() if c.target in p.ranks.values() and p.settled_at is None]
                assert not unsettled, f"{c.target} off before {unsettled} checkpointed or ran out of time"


def drain(s: Site) -> None:
    """Mains back for good; every device and agent does what it is told."""
    s.send(s.power("A", False, charge_pct=100), s.power("B", False, charge_pct=100))
    for _ in range(4):
        sid = current(s)
        if sid is None:
            return
        rec = s.core.open[sid]
        s.send(*[s.node(n, "off", sid) for n, p in rec.nodes.items() if p.shutdown_at is not None])
        s.advance(s.policy.restore_stable_s + 1)
        if sid in s.core.open:
            s.send(*[s.node(n, "ready", sid) for n, p in rec.nodes.items() if p.power_on_at is not None])
        if sid in s.core.open:
            s.send(*[s.resumed(j, sid) for j in rec.jobs])
        s.advance(1)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps, st.sampled_from(["checkpoint-at-stop", "pause", "continue"]))
def test_site_invariants(steps_, hold_policy):
    s = Site(policy=POLICY.model_copy(update={"hold_policy": hold_policy}))
    for step in steps_:
        seen = len(s.steps)
        apply(s, step)
        for out in s.steps[seen:]:
            check(s, out)
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
