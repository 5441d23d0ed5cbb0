"""power-control's sequences as plans (plans.py): pure functions of the command, the site and
the clock's now. Examples, then hypothesis properties: order, deadlines, one action at a time
per node, a dead device never holding another node's steps."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from powerguard.power_control.config import PowerControlSettings
from powerguard.power_control.plans import call_s, outlet_s, restore_plan, shutdown_plan
from powerguard.power_control.ramp import Ramp, RampSettings
from powerguard.schemas import NodeConfig

NOW = 1000.0


def node(name: str, *, outlets: int = 0, group: int = 0, pdu: str = "p1") -> NodeConfig:
    base = 10 * int("".join(c for c in name if c.isdigit()) or 0)  # n1: outlets 11, 12, ...
    refs = [{"pdu": pdu, "outlet": base + i + 1} for i in range(outlets)]
    return NodeConfig.model_validate({"name": name, "feeds": ["ups-a"], "outlets": refs, "power_on_group": group})


def settings_(**kw) -> PowerControlSettings:
    return PowerControlSettings.model_validate(kw)


def actions(plan) -> list[tuple[str, str]]:
    return [(s.action, s.when) for s in plan.steps]


# ----------------------------------------------------------------------------- examples
def test_a_shutdown_stops_the_jobs_then_soft_off_then_hard_off_with_their_waits():
    s = settings_(soft_off_timeout_s=120, device_timeout_s=10, retries=3, retry_backoff_s=2)
    plan = shutdown_plan(node("n1"), s, now=NOW, jobs=["j1"], retry=0, bmc="bmc:n1", scheduler="slurm")
    assert actions(plan) == [("job_stop", "always"), ("status", "always"), ("soft_off", "on"), ("off", "still_on")]
    soft, hard = plan.steps[2], plan.steps[3]
    assert (soft.wait_s, hard.wait_s) == (120, 10)
    assert call_s(s) == 4 * 10 + 2 * (1 + 2 + 4)  # four attempts, three backoffs
    assert plan.steps[0].deadline == NOW + s.job_stop_grace_s + s.job_stop_wait_s + call_s(s)
    assert plan.deadline == plan.steps[0].deadline + 3 * call_s(s) + 120 + 10


def test_outlets_go_off_after_the_bmc_or_instead_of_it_on_a_retry():
    two = node("n1", outlets=2)
    s = settings_(outlets_off_on_shutdown=True)
    plan = shutdown_plan(two, s, now=NOW, jobs=[], retry=0, bmc="bmc:n1", scheduler="none")
    assert actions(plan)[-2:] == [("outlet_off", "always")] * 2
    retry = shutdown_plan(two, settings_(), now=NOW, jobs=[], retry=1, bmc="bmc:n1", scheduler="none")
    assert actions(retry)[-2:] == [("outlet_off", "bmc_failed")] * 2
    assert [s.device for s in retry.steps[-2:]] == ["pdu:p1:11", "pdu:p1:12"]
    no_bmc = shutdown_plan(two, settings_(), now=NOW, jobs=["j"], retry=0, bmc=None, scheduler="none")
    assert actions(no_bmc) == [("job_stop", "always")]  # its jobs stopped; nothing to switch


def test_a_restore_goes_group_by_group_and_the_ramp_spaces_the_power_ons():
    site = {"s1": node("s1", group=0), "c1": node("c1", group=1), "c2": node("c2", group=1, outlets=1)}
    s = settings_(ramp={"nodes_per_min": 60}, boot_timeout_s=100)
    plan = restore_plan(["c2", "c1", "s1"], site, s, now=NOW, bmcs={"s1", "c1"})
    assert [(g.group, [n.node for n in g.nodes]) for g in plan.groups] == [(0, ["s1"]), (1, ["c1", "c2"])]
    assert plan.node("c2").switch == "outlet" and plan.node("c2").outlets == ("pdu:p1:21",)
    assert plan.node("s1").slot == NOW
    c1, c2 = plan.node("c1"), plan.node("c2")
    assert c1.slot == plan.groups[0].deadline  # group 1 starts once group 0 ended, at the latest
    assert c2.slot == c1.slot + 1.0  # 60 nodes a minute: one a second
    assert plan.node("s1").deadline == NOW + call_s(s) + 100


# ----------------------------------------------------------------------------- properties
nodes_st = st.lists(
    st.tuples(st.integers(0, 2), st.integers(0, 2), st.booleans()),  # group, outlets, has a BMC
    min_size=1,
    max_size=12,
)
settings_st = st.builds(
    lambda soft, dev, retries, backoff, stagger, rate, off: settings_(
        soft_off_timeout_s=soft,
        device_timeout_s=dev,
        retries=retries,
        retry_backoff_s=backoff,
        outlet_stagger_s=stagger,
        outlets_off_on_shutdown=off,
        ramp={"nodes_per_min": rate} if rate else {},
    ),
    st.floats(1, 300),
    st.floats(0.5, 30),
    st.integers(0, 4),
    st.floats(0, 5),
    st.floats(0, 5),
    st.one_of(st.none(), st.floats(1, 600)),
    st.booleans(),
)


@settings(max_examples=200, deadline=None)
@given(shape=nodes_st, s=settings_st, jobs=st.integers(0, 3), retry=st.integers(0, 2))
def test_every_shutdown_plan_is_ordered_bounded_and_one_step_at_a_time(shape, s, jobs, retry):
    for i, (_, outlets, has_bmc) in enumerate(shape):
        cfg = node(f"n{i}", outlets=outlets)
        plan = shutdown_plan(
            cfg,
            s,
            now=NOW,
            jobs=[f"j{k}" for k in range(jobs)],
            retry=retry,
            bmc="bmc" if has_bmc else None,
            scheduler="x",
        )
        names = [x.action for x in plan.steps]
        assert names[0] == "job_stop"  # the jobs first: their checkpoint is durable, their stop comes before power
        if has_bmc:
            assert names[1:4] == ["status", "soft_off", "off"]  # read, soft, then hard: never hard first
        else:
            assert not {"status", "soft_off", "off"} & set(names)
        assert all(n == "outlet_off" for n in names[4 if has_bmc else 1 :])  # outlets only after the BMC
        fallback = [x for x in plan.steps if x.when == "bmc_failed"]
        assert len(fallback) == (outlets if has_bmc and retry else 0)
        # one node, one step at a time: each step ends no earlier than the one before (every wait bounded)
        ends = [NOW] + [x.deadline for x in plan.steps]
        assert all(b > a for a, b in itertools.pairwise(ends))
        bound = (
            (s.job_stop_grace_s + s.job_stop_wait_s if jobs else 0)
            + call_s(s)
            + (3 * call_s(s) + s.soft_off_timeout_s + s.device_timeout_s if has_bmc else 0)
            + 2 * outlets * outlet_s(s)
        )
        assert plan.deadline <= NOW + bound + 1e-6


@settings(max_examples=200, deadline=None)
@given(shape=nodes_st, s=settings_st)
def test_every_restore_plan_keeps_group_order_ramp_spacing_and_independent_deadlines(shape, s):
    site = {f"n{i}": node(f"n{i}", outlets=o, group=g, pdu=f"p{i % 2}") for i, (g, o, _) in enumerate(shape)}
    bmcs = {f"n{i}" for i, (_, _, b) in enumerate(shape) if b}
    plan = restore_plan(list(site) + list(site)[:1], site, s, now=NOW, bmcs=bmcs)  # a repeated order: once
    seen = [n.node for g in plan.groups for n in g.nodes]
    assert sorted(seen) == sorted(site)  # every node exactly once: never two power-ons of one node
    assert [g.group for g in plan.groups] == sorted({g for g, _, _ in shape})
    start, outlets = NOW, sum(o for _, o, _ in shape)
    for g in plan.groups:
        assert [n.node for n in g.nodes] == sorted(n.node for n in g.nodes)
        for n in g.nodes:
            assert n.slot >= start  # a group starts once the one before ended (at the latest)
            own = len(n.outlets) * outlet_s(s) + (call_s(s) if n.switch == "bmc" else 0) + s.boot_timeout_s
            # its own devices' bounds only (and the site's spacing: the stagger, the ramp): however dead
            # another node's devices are, this one is ready or reported failed by then
            spacing = start + outlets * s.outlet_stagger_s
            assert n.deadline <= max(n.slot, spacing) + own + s.batch_interval_s + 1e-6
            assert (n.switch == "bmc") == (n.node in bmcs)
        start = g.deadline
    if s.ramp.enabled:  # the ramp's slots, as every device answering would see them: rate-spaced per scope
        ramp = Ramp(s.ramp)
        by_scope: dict[str, list[float]] = {}
        for g in plan.groups:
            for n in g.nodes:
                for scope, cost in ramp.costs(n.node, n.pdus).items():
                    by_scope.setdefault(scope, []).append((n.slot, cost))
        for slots in by_scope.values():
            for (a, cost), (b, _) in itertools.pairwise(sorted(slots)):
                assert b - a >= cost - 1e-6


def test_the_plans_read_no_clock():
    """Pure: the same inputs, the same plan (the runner passes the clock's now in)."""
    s = settings_(ramp=RampSettings(nodes_per_min=30))
    site = {"a": node("a", outlets=1), "b": node("b", group=1)}
    assert restore_plan(["a", "b"], site, s, now=5.0, bmcs={"b"}) == restore_plan(
        ["b", "a"], site, s, now=5.0, bmcs={"b"}
    )
    one = shutdown_plan(site["a"], s, now=5.0, jobs=["j"], retry=1, bmc="bmc:a", scheduler="x")
    assert one == shutdown_plan(site["a"], s, now=5.0, jobs=["j"], retry=1, bmc="bmc:a", scheduler="x")
