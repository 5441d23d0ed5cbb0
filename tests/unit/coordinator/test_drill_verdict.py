"""`powerguard drill`'s verdict says why it is or is not OK, and never OK when steps were lost."""

from __future__ import annotations

from powerguard.coordinator.drill import DrillResult


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
