"""`powerguard drill`'s verdict says why it is or is not OK, and never OK when steps were lost."""

from __future__ import annotations

from powerguard.ops.site_drill import DrillResult


def done(**kw) -> DrillResult:
    r = DrillResult(saga_id="s1", states=["checkpointing", "holding", "shutting_down", "done"], budget_s=30, **kw)
    return r


def test_a_drill_with_no_job_registered_says_why_it_is_not_ok():
    r = done()
    assert not r.ok
    assert r.problems[0].startswith("no job on the nodes at risk has a registered agent")


def test_a_drill_that_checkpointed_every_rank_in_budget_is_ok():
    r = done(expected={"j1": 2}, acks={"j1": {0: 0.8, 1: 0.9}})
    assert r.ok and r.problems == []


def test_steps_lost_under_checkpoint_at_stop_make_the_drill_not_ok_with_the_reason():
    r = done(
        expected={"j1": 2},
        acks={"j1": {0: 0.8, 1: 0.9}},
        lost_steps={"j1": 69},
        stop_reason="runtime 100s below the 120s shutdown reserve; final checkpoint skipped: j1",
    )
    assert not r.ok
    assert r.problems == [
        "j1 lost 69 step(s) at the stop under checkpoint-at-stop "
        "(runtime 100s below the 120s shutdown reserve; final checkpoint skipped: j1)"
    ]
    assert done(expected={"j1": 1}, acks={"j1": {0: 1}}, lost_steps={"j1": 5}, hold_policy="continue").ok


def test_missing_and_failed_ranks_and_real_commands_are_each_named():
    r = done(
        expected={"j1": 3},
        acks={"j1": {0: 1.0}},
        failed={"j1": {1: "disk full"}},
        not_dry=["shutdown_requested n1 (REAL)"],
    )
    assert r.problems == [
        "j1: ranks 1,2 did not ack",
        "j1 rank 1: checkpoint failed: disk full",
        "1 command(s) NOT dry-run: shutdown_requested n1 (REAL)",
    ]


def test_the_final_checkpoint_is_timed_from_its_own_request_not_mixed_into_the_first_round():
    """Found by the bare-metal guide's drill: under checkpoint-at-stop the final checkpoint's acks
    (16 s after on-battery) overwrote the first round's (1 s) and the drill said "over budget"."""
    from powerguard.ops.site_drill import _observe
    from powerguard.schemas import CheckpointDurable, CheckpointDurableData, SagaData, SagaStateChanged

    r = DrillResult(saga_id="s1", expected={"j1": 1}, budget_s=10)

    def at(dt: float, ev) -> None:
        _observe(ev, r, 1000.0, lambda *_: None, now=1000.0 + dt)

    def state(name: str) -> SagaStateChanged:
        return SagaStateChanged(data=SagaData(saga_id="s1", site="dc1", ups=["u"], state=name, nodes=["n1"]))

    def ack(step: int) -> CheckpointDurable:
        data = CheckpointDurableData(
            request_id="r",
            saga_id="s1",
            job="j1",
            rank=0,
            world_size=1,
            step=step,
            durability="local",
            path="/x",
            bytes=1,
            digest="d",
        )
        return CheckpointDurable(data=data)

    at(0.1, state("checkpointing"))
    at(1.0, ack(10))
    at(15.0, state("final_checkpoint"))
    at(15.7, ack(300))
    at(15.8, state("done"))
    assert r.slowest_s == 1.0
    assert round(r.final_acks["j1"][0], 3) == 0.7
    assert r.problems == []
