"""What one party may say never changes what the real sagas decide for the others, as a property
of the pure site core: for any interleaving of an outsider's allowed traffic with a real site's
outage — the operator's drill readings, and acks from a job that is not at risk (its agent may
publish on its own job's subjects only, but it writes the request ids, levels and rank spans it
likes: rank 0's span of any width and a few more) — the real sagas decide exactly what they
decide without it: the same records, the same commands, at the same moments."""

from __future__ import annotations

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from powerguard.schemas import CheckpointDurable, CheckpointDurableData

from .harness import POLICY
from .test_drill_apart_properties import Apart, apply, drill, real, reality

JOBS = st.sampled_from(["j1", "j2", "j3"])
LEVEL = st.sampled_from(["local", "replicated:1", "replicated:2", "remote"])
SPANS = st.tuples(st.integers(0, 7), st.lists(st.integers(8, 4096), max_size=8, unique=True)).map(
    lambda t: [(0, t[0]), *((r, r) for r in sorted(t[1]))]  # rank 0's span, then up to 8 more: any width
)

# the real jobs' own rank 0 answering for every rank (acks: job), at any level
job_acks = st.tuples(st.just("job_ack"), JOBS, st.sampled_from(["ckpt", "final"]), LEVEL)
# an outsider job's acks, naming a real job's request
rogue = st.tuples(st.just("rogue_ack"), JOBS, st.sampled_from(["ckpt", "final", "hold"]), LEVEL, SPANS)


def send_job_ack(s, job: str, rnd: str, level: str, *, as_job: str, spans=None) -> None:
    for sid, rec in list(s.core.open.items()):
        if rec.drill or job not in rec.jobs:
            continue
        plan = rec.jobs[job]
        rounds = {"ckpt": plan, "final": plan.final, "hold": plan.hold}
        target = rounds.get(rnd)
        if target is None:
            continue
        data = CheckpointDurableData(
            request_id=target.request_id,
            saga_id=sid,
            job=as_job,
            rank=0,
            step=101,
            path="/ckpt",
            bytes=1,
            digest="0" * 32,
            durability=level,
            ranks=spans or [(0, plan.world_size - 1)],
        )
        s.send(CheckpointDurable(data=data))


def step_on(s, step) -> None:
    kind, *args = step
    if kind == "job_ack":
        job, rnd, level = args
        send_job_ack(s, job, rnd, level, as_job=job)
    elif kind == "rogue_ack":
        job, rnd, level, spans = args
        send_job_ack(s, job, rnd, level, as_job="j9", spans=spans)  # j9: a job on no node at risk
    else:
        apply(s, step)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# the collision the spoken-ack set once allowed: an outsider names j1's request first
@example(
    [
        ("power", "A", True, 300.0, False, 0.0),
        ("rogue_ack", "j1", "ckpt", "local", [(0, 3)]),
        ("job_ack", "j1", "ckpt", "local"),
    ],
    "continue",
)
@given(
    st.lists(st.one_of(real, job_acks, rogue, drill), min_size=1, max_size=50),
    st.sampled_from(["checkpoint-at-stop", "pause", "continue"]),
)
def test_the_real_sagas_decide_the_same_with_or_without_an_outsiders_traffic(steps_, hold_policy):
    policy = POLICY.model_copy(update={"hold_policy": hold_policy})
    with_traffic, without = Apart(policy=policy), Apart(policy=policy)
    for step in steps_:
        step_on(with_traffic, step)
        if step[0] != "rogue_ack" and not step[0].startswith("drill_"):
            step_on(without, step)
    assert reality(with_traffic) == reality(without)
