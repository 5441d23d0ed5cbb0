"""What one party may say never changes what the real sagas decide for the others, as a property
of the pure site core: for any interleaving of an outsider's allowed traffic with a real site's
outage — the operator's drill readings, and acks from a job that is not at risk (its agent may
publish on its own job's subjects only, but it writes the request ids, levels and rank spans it
likes, up to the schema's 512 spans) — the real sagas decide exactly what they decide without it:
the same records, the same commands, at the same moments."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from powerguard.schemas import CheckpointDurable, CheckpointDurableData

from .harness import POLICY
from .test_drill_apart_properties import Apart, apply, drill, real, reality

JOBS = st.sampled_from(["j1", "j2", "j3"])
LEVEL = st.sampled_from(["local", "replicated:1", "replicated:2", "remote"])
SPANS = st.lists(st.tuples(st.integers(0, 7), st.integers(0, 7)), min_size=1, max_size=512).map(
    lambda xs: sorted({(min(a, b), max(a, b)) for a, b in xs})[:1]  # one span: valid, any width
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
