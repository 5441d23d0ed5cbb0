"""How a client tries again (bus/reconnect.py): exponential backoff with jitter, slower for a
refused credential, one warning line per while."""

from __future__ import annotations

from itertools import pairwise
from types import SimpleNamespace

import pytest
from nats.errors import AuthorizationError

from powerguard.bus.reconnect import Backoff, FailureLog


def attempts(b: Backoff, exc: BaseException, seconds: float) -> list[float]:
    """When each attempt is made in ``seconds`` of failures, as the client makes them."""
    t, out = 0.0, []
    while True:
        t += b.delay()
        if t > seconds:
            return out
        out.append(t)
        b.failed(exc)


def test_a_refused_credential_backs_off_to_one_attempt_per_30s_within_a_minute():
    """Before: one attempt every 0.25 s, ~440 a minute."""
    b = Backoff(rng=lambda: 0.0)  # the shortest jitter: the most attempts
    times = attempts(b, AuthorizationError(), 600)
    assert len(times) < 30  # in ten minutes
    after = [t for t in times if t > 60]
    assert all(b - a >= 10 for a, b in pairwise(after))
    assert b.nominal() == 60


def test_an_unreachable_server_is_tried_again_at_least_every_5s():
    b = Backoff(rng=lambda: 1.0)  # the longest jitter
    times = attempts(b, ConnectionRefusedError(111, "Connect call failed"), 60)
    gaps = [y - x for x, y in pairwise(times)]
    assert max(gaps) <= 5 * 1.2 + 1e-9 and times[0] == 0.0
    b.connected()
    assert b.delay() == 0.0 and not b.refusing


def test_jitter_spreads_the_delays_and_the_least_tried_server_goes_first():
    lo, hi = Backoff(rng=lambda: 0.0), Backoff(rng=lambda: 1.0)
    for b in (lo, hi):
        for _ in range(5):
            b.failed(OSError())
    assert lo.delay() == pytest.approx(3.2) and hi.delay() == pytest.approx(4.8)
    servers = [SimpleNamespace(uri="a", reconnects=3), SimpleNamespace(uri="b", reconnects=1)]
    assert lo.choose(servers, {})[0].uri == "b"


def test_failures_are_said_once_then_once_per_while_with_a_count():
    log = FailureLog(every_s=30)
    said = [log.note(AuthorizationError(), float(t), 1.0) for t in range(0, 65)]
    lines = [s for s in said if s]
    assert len(lines) == 3  # at 0 s, 30 s, 60 s
    assert "refused the credential" in lines[0] and "(30 attempts since the last line)" in lines[1]
