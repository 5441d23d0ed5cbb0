"""An evaluation never costs the power checkpoint: a real 2-rank job (torchrun, gloo) evaluating
for 20 s after every 30 steps, a real nats-server and the real coordinator with a 10 s
checkpoint deadline. The outage comes while the ranks evaluate: inside ``guard.quiescent()`` the
agent checkpoints the last step's state at once, well inside the deadline. Without it the request
waits for the next step boundary, 20 s away, and the round ends at its deadline with no rank
acked (what a nanoGPT-sized evaluation did: 17 s late, and the drill said OK)."""

from __future__ import annotations

import pytest

from powerguard.schemas import OnBattery

from ..ckpt.runner import Trainer
from ..ckpt.test_agent import registered
from .helpers import SagaWatch, eventually
from .test_hold_policies import coordinating, reading, saga_record, site

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
EVAL_EVERY, EVAL_S, DEADLINE_S = 30, 20.0, 10.0


def evaluations(path) -> list[tuple[int, int, str, float]]:
    rows = path.read_text().split("\n") if path.exists() else []
    return [(int(r), int(s), what, float(t)) for r, s, what, t in (row.split() for row in rows if row)]


async def outage_during_an_evaluation(make_bus, names, nats_server, tmp_path, **job_flags):
    bus, ups = await make_bus("coordinator"), await make_bus("ups-monitor")
    log = tmp_path / "eval.txt"
    job = Trainer(
        tmp_path,
        "jeval",
        nats_url=nats_server.url,
        names=names,
        steps=100_000,
        step_sleep=0.02,
        nodes="n1,n2",
        eval_every=EVAL_EVERY,
        eval_s=EVAL_S,
        eval_log=str(log),
        **job_flags,
    )
    async with coordinating(bus, site(ckpt_timeout_s=DEADLINE_S, ckpt_retries=0)):
        watch = await SagaWatch(bus).start()
        await job.start()
        try:
            await registered(bus, "jeval")
            await eventually(lambda: len(evaluations(log)) == 2, 120, "both ranks to start an evaluation")
            await ups.publish(OnBattery(data=reading(True, 300)))
            await watch.reach("holding", 60)
            rec = await saga_record(bus)
        finally:
            await job.kill()
    return rec.jobs["jeval"], evaluations(log)


async def test_a_request_during_a_20s_evaluation_is_checkpointed_within_its_10s_deadline(
    make_bus, names, nats_server, tmp_path
):
    plan, evals = await outage_during_an_evaluation(make_bus, names, nats_server, tmp_path)
    assert plan.complete and not plan.failed, f"missing {plan.missing}, failed {plan.failed}"
    assert plan.duration_s < DEADLINE_S
    started = {s for _, s, what, _ in evals if what == "start"}
    assert started == {plan.step}  # the last step before the evaluation: its state, as the ranks left it
    ended = [t for _, s, what, t in evals if what == "end"]
    assert not ended or min(ended) > plan.settled_at, "the checkpoint waited for the evaluation to end"


async def test_without_a_quiescent_phase_the_request_waits_past_its_deadline(make_bus, names, nats_server, tmp_path):
    """What the test above guards against, shown: the same job evaluating outside
    ``guard.quiescent()`` answers nothing before the deadline."""
    plan, _ = await outage_during_an_evaluation(make_bus, names, nats_server, tmp_path, eval_outside_quiescent=True)
    assert not plan.complete and plan.settled_at - plan.requested_at >= DEADLINE_S - 0.5
