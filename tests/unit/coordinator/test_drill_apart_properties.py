"""Drills live apart from reality, as a property of the pure site core: for any interleaving of
a drill's events (readings on the drill subject, the drill sagas' acks, node reports and
resumes) with a real site's, the real sagas decide exactly what they decide without the drill's
events: the same records, the same commands, at the same moments."""

from __future__ import annotations

from itertools import count

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from powerguard.coordinator.core import SiteCore

from .harness import POLICY, TOPO, registry
from .site import Site

UPS = st.sampled_from(["A", "B"])
RUNTIME = st.one_of(st.none(), st.floats(min_value=0, max_value=1000))
AGE = st.sampled_from([0.0, 0.0, 5.0, -30.0, -86_400.0, 86_400.0])  # late, ahead within the skew, far off

real = st.one_of(
    st.tuples(st.just("power"), UPS, st.booleans(), RUNTIME, st.booleans(), AGE),
    st.tuples(st.just("acks"), st.sampled_from(["j1", "j2", "j3"]), st.sampled_from(["ckpt", "final"])),
    st.tuples(st.just("node"), st.sampled_from(sorted(TOPO.feeds)), st.sampled_from(["off", "ready"])),
    st.tuples(st.just("resumed"), st.sampled_from(["j1", "j2", "j3"])),
    st.tuples(st.just("advance"), st.floats(min_value=0, max_value=400)),
)
drill = st.one_of(
    st.tuples(st.just("drill_power"), UPS, st.booleans(), RUNTIME, st.booleans(), AGE),
    st.tuples(st.just("drill_acks"), st.sampled_from(["j1", "j2", "j3"]), st.sampled_from(["ckpt", "final"])),
    st.tuples(st.just("drill_node"), st.sampled_from(sorted(TOPO.feeds)), st.sampled_from(["off", "ready"])),
    st.tuples(st.just("drill_resumed"), st.sampled_from(["j1", "j2", "j3"])),
)
steps = st.lists(st.one_of(real, drill), min_size=1, max_size=50)


class Apart(Site):
    """A site whose saga ids are unique tokens (``saga0001x``), so they can be renamed."""

    def __post_init__(self) -> None:
        ids = count(1)
        self.core = SiteCore(TOPO, self.policy, registry=registry(), saga_id=lambda site, now: f"saga{next(ids):04d}x")


def sagas(s: Site, drill: bool) -> list[str]:
    return [sid for sid, r in s.core.open.items() if r.drill == drill]


def apply(s: Site, step) -> None:
    kind, *args = step
    world = kind.startswith("drill_")
    kind = kind.removeprefix("drill_")
    mine = sagas(s, world)
    match kind, args:
        case "power", [ups, on_battery, runtime, lb, age]:
            status = ["OB" if on_battery else "OL"] + ["LB"] * lb
            s.send(s.power(ups, on_battery, runtime_s=runtime, status=status, age_s=age, drill=world))
        case "acks", [job, rnd]:
            for sid in [o for o in mine if job in s.core.open[o].jobs]:
                plan = s.core.open[sid].jobs[job]
                s.send(*s.acks(sid, job, round=rnd if rnd == "final" else plan.request_id.rsplit("/", 1)[1]))
        case "node", [node, state]:
            for sid in [o for o in mine if node in s.core.open[o].nodes]:
                s.send(s.node(node, state, sid))
        case "resumed", [job]:
            for sid in [o for o in mine if job in s.core.open[o].jobs or job in s.core.open[o].carried]:
                s.send(s.resumed(job, sid))
        case "advance", [dt]:
            s.advance(dt)


RANDOM = {"trace_id", "root_span_id", "id_secret"}  # drawn afresh for every saga


def reality(s: Site) -> str:
    """Everything the real sagas decided so far, their ids renamed in the order they started."""
    started = [sid for st_ in s.steps for sid in st_.started]
    real = [sid for sid in dict.fromkeys(started) if not _record(s, sid).drill]
    records = [_record(s, sid).model_dump_json(exclude=RANDOM) for sid in real]
    commands = [  # in the order issued (records time every transition)
        (c.kind, c.key, c.target, sorted(c.args.items()))
        for st_ in s.steps
        for sid, cmds in st_.commands.items()
        if sid in real
        for c in cmds
    ]
    text = repr((records, commands, sorted(s.core.ups.items(), key=lambda kv: kv[0])))
    for n, sid in enumerate(real):
        text = text.replace(sid, f"real{n}")
    return text


def _record(s: Site, sid: str):
    for st_ in reversed(s.steps):
        for rec in st_.changed:
            if rec.saga_id == sid:
                return rec
    raise KeyError(sid)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps, st.sampled_from(["checkpoint-at-stop", "pause", "continue"]))
def test_the_real_sagas_decide_the_same_with_or_without_the_drills_events(steps_, hold_policy):
    policy = POLICY.model_copy(update={"hold_policy": hold_policy})
    with_drills, without = Apart(policy=policy), Apart(policy=policy)
    for step in steps_:
        apply(with_drills, step)
        if not step[0].startswith("drill_"):
            apply(without, step)
            assert with_drills.now == without.now
    assert reality(with_drills) == reality(without)
