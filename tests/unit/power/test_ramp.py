"""The power-on ramp as a pure object: evenly spaced starts per scope (site nodes/min, site
kW/min with each node's figure, per PDU), the total time the rates allow, no ramp: no wait."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from powerguard.power_control.ramp import Ramp, RampSettings


def test_no_rate_means_no_ramp():
    r = Ramp(RampSettings())
    assert not r.settings.enabled
    assert [r.reserve(f"n{i}", ["p1"], 100.0) for i in range(5)] == [100.0] * 5


def test_nodes_per_minute_spaces_every_start_evenly():
    r = Ramp(RampSettings(nodes_per_min=60))
    assert [r.reserve(f"n{i}", [], 0.0) for i in range(5)] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert r.horizon(0.0) == 5.0
    assert r.reserve("late", [], 10.0) == 10.0  # a free ramp starts a node at once


def test_kw_per_minute_uses_each_nodes_draw():
    r = Ramp(RampSettings(kw_per_min=600, node_kw=10, node_kw_by_node={"big": 20}))  # 10 kW/s
    assert r.reserve("a", [], 0.0) == 0.0  # 10 kW: the next may start after 1 s
    assert r.reserve("big", [], 0.0) == 1.0  # 20 kW: holds the ramp 2 s
    assert r.reserve("c", [], 0.0) == 3.0


def test_each_pdu_has_its_own_ramp_and_a_node_on_two_waits_for_both():
    r = Ramp(RampSettings(pdu_nodes_per_min=30))  # 2 s per node per PDU
    assert r.reserve("a1", ["pdu-a"], 0.0) == 0.0
    assert r.reserve("b1", ["pdu-b"], 0.0) == 0.0  # another breaker: at once
    assert r.reserve("a2", ["pdu-a"], 0.0) == 2.0
    assert r.reserve("ab", ["pdu-a", "pdu-b"], 0.0) == 4.0  # A+B fed: both breakers take its inrush


def test_site_and_pdu_rates_together():
    r = Ramp(RampSettings(nodes_per_min=120, pdu_nodes_per_min=30))  # site 0.5 s, per PDU 2 s
    starts = [r.reserve(f"n{i}", [f"pdu-{i % 2}"], 0.0) for i in range(4)]
    assert starts == [0.0, 0.5, 2.0, 2.5]


def test_rates_must_be_positive():
    with pytest.raises(ValidationError):
        RampSettings(nodes_per_min=0)


@settings(max_examples=200, deadline=None)
@given(
    rate=st.floats(min_value=1, max_value=100_000),
    arrivals=st.lists(st.floats(min_value=0, max_value=100), min_size=1, max_size=50),
)
def test_starts_never_come_closer_than_the_rate_allows(rate, arrivals):
    r = Ramp(RampSettings(nodes_per_min=rate))
    starts = [r.reserve(f"n{i}", [], t) for i, t in enumerate(sorted(arrivals))]
    assert all(s >= t for s, t in zip(starts, sorted(arrivals), strict=True))  # never before it is asked
    gap = 60.0 / rate
    assert all(b - a >= gap * (1 - 1e-9) for a, b in itertools.pairwise(starts))
    # and never later than needed: the last start is back to back behind some earlier arrival
    ts = sorted(arrivals)
    assert starts[-1] <= max(t + gap * (len(ts) - 1 - i) for i, t in enumerate(ts)) + 1e-6
