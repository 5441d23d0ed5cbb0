"""The power-on ramp as a pure object: evenly spaced starts per scope (site nodes/min, site
kW/min with each node's figure, per PDU), the total time the rates allow, no ramp: no wait."""

from __future__ import annotations

import itertools
import math

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


def test_a_late_start_pushes_the_next_node_back_so_actual_starts_stay_a_cost_apart():
    r = Ramp(RampSettings(nodes_per_min=60))
    a, b = r.reserve("a", [], 0.0), r.reserve("b", [], 0.0)
    assert (a, b) == (0.0, 1.0)
    r.started("a", [], 0.9)  # a started 0.9 s late (its BMC session was slow to set up)
    assert r.ready_at("b", []) == math.inf  # a's command is in flight: b waits for it to land
    r.landed("a", [], 0.95)
    assert r.ready_at("b", []) == 1.95  # not its planned 1.0: a landed at 0.95
    assert r.reserve("c", [], 0.0) == 2.0  # the plan moved: c after b's slot
    r.started("b", [], 1.95)
    r.landed("b", [], 1.96)
    assert r.ready_at("c", []) == 2.96
    assert r.horizon(1.96) == pytest.approx(3.0 - 1.96)  # c holds the ramp until its slot ends


def test_scopes_in_flight_hold_only_their_own_nodes():
    r = Ramp(RampSettings(pdu_nodes_per_min=60))
    r.started("a1", ["pdu-a"], 0.0)
    assert r.ready_at("a2", ["pdu-a"]) == math.inf
    assert r.ready_at("b1", ["pdu-b"]) == 0.0  # another breaker: no wait
    assert r.ready_at("ab", ["pdu-a", "pdu-b"]) == math.inf  # fed by both: waits for a's


@settings(max_examples=200, deadline=None)
@given(
    delays=st.lists(st.tuples(st.floats(0, 3), st.floats(0, 2)), min_size=2, max_size=12),
    rate=st.sampled_from([30.0, 60.0, 600.0]),
)
def test_whatever_the_delays_no_two_commands_reach_devices_closer_than_the_rate(delays, rate):
    """Each node is late by d (session setup) and its command takes l to be answered; the device
    gets it somewhere in between. A node starts at max(its slot + d, ready_at); commands run one
    scope at a time, in order of when nodes want to start. Every pair of windows [start, landed]
    is at least 60/rate apart, so the devices' own arrival times are too."""
    r = Ramp(RampSettings(nodes_per_min=rate))
    cost = 60.0 / rate
    slots = [r.reserve(f"n{i}", [], 0.0) for i in range(len(delays))]
    wants = sorted((slot + d, i) for i, (slot, (d, _)) in enumerate(zip(slots, delays, strict=True)))
    windows = []
    now = 0.0
    for want, i in wants:
        now = max(now, want, r.ready_at(f"n{i}", []))
        assert now != math.inf
        r.started(f"n{i}", [], now)
        landed = now + delays[i][1]
        r.landed(f"n{i}", [], landed)
        windows.append((now, landed))
    for (_, prev_landed), (start, _) in itertools.pairwise(windows):
        assert start - prev_landed >= cost - 1e-9
