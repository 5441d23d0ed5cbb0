"""The consumers' dead-letter budget (pure, clock injected): a burst, then a rate; what is not
copied is counted and summed up once per interval, never silently dropped."""

from __future__ import annotations

from powerguard.bus.dlq_budget import DeadLetterBudget


def test_a_burst_is_copied_then_at_most_the_rate():
    b = DeadLetterBudget(rate_per_s=20, burst=100)
    assert sum(b.take(0.0) for _ in range(1000)) == 100
    assert sum(b.take(1.0) for _ in range(1000)) == 20  # one second later: the rate's worth
    assert b.take(100.0)  # the bucket refills (to the burst, not beyond)
    assert sum(b.take(100.0) for _ in range(1000)) == 99


def test_what_is_not_copied_is_counted_and_reported_once_per_interval():
    b = DeadLetterBudget(rate_per_s=1, burst=1, report_every_s=10)
    assert b.report(0.0) is None  # nothing suppressed: nothing to say
    for _ in range(3):
        b.suppressed("MalformedEvent", "pg.ckpt.jobA.0.ack")
    b.suppressed("SubjectMismatch", "pg.ckpt.jobA.0.ack")
    said = b.report(0.0)
    assert said is not None and said.startswith("4 rejected message(s) refused without a dead-letter copy")
    assert "3 MalformedEvent" in said and "1 SubjectMismatch" in said and "pg.ckpt.jobA.0.ack" in said
    b.suppressed("MalformedEvent", "pg.ckpt.jobA.0.ack")
    assert b.report(5.0) is None  # within the interval: kept for the next report
    assert b.report(10.0).startswith("1 rejected message(s)")
