"""The per-UPS state machine and NUT status parsing (pure)."""

from __future__ import annotations

from powerguard.ups_monitor.reading import Reading
from powerguard.ups_monitor.state import UpsState


def kinds(transitions) -> list[str]:
    return [t.kind for t in transitions if t.kind != "status"]


def test_nut_status_flags():
    r = Reading.from_status("OB DISCHRG LB", runtime_s=60)
    assert r.on_battery and r.low_battery and not r.fsd and r.status == ("OB", "DISCHRG", "LB")
    assert Reading.from_status("OL CHRG RB OVER").replace_battery and Reading.from_status("OL OVER").overload
    assert Reading.from_status("FSD OB LB").fsd


def test_outage_sequence():
    s = UpsState(comm_timeout_s=10, status_every_s=30)
    assert kinds(s.good(Reading.from_status("OL"), 0)) == []
    assert kinds(s.good(Reading.from_status("OB DISCHRG"), 1)) == ["on_battery"]
    assert kinds(s.good(Reading.from_status("OB DISCHRG"), 2)) == []
    assert kinds(s.good(Reading.from_status("OB DISCHRG LB"), 3)) == ["low_battery"]
    assert kinds(s.good(Reading.from_status("OL CHRG"), 4)) == ["on_line"]


def test_comm_loss_is_never_on_battery_and_recovers():
    s = UpsState(comm_timeout_s=10, status_every_s=30, started_at=0)
    s.good(Reading.from_status("OL"), 0)
    assert s.failed("timeout", 5) == []
    lost = s.failed("timeout", 10)
    assert [t.kind for t in lost] == ["comm_lost"] and lost[0].reason == "timeout"
    assert s.failed("timeout", 20) == []  # once
    assert kinds(s.good(Reading.from_status("OL"), 21)) == ["comm_restored"]


def test_comm_lost_before_any_reading_counts_from_start():
    s = UpsState(comm_timeout_s=5, started_at=100)
    assert s.failed("refused", 104) == []
    assert [t.kind for t in s.failed("refused", 105)] == ["comm_lost"]


def test_status_telemetry_is_periodic():
    s = UpsState(status_every_s=30)
    assert [t.kind for t in s.good(Reading.from_status("OL"), 0)] == ["status"]
    assert s.good(Reading.from_status("OL"), 10) == []
    assert [t.kind for t in s.good(Reading.from_status("OL"), 30)] == ["status"]
