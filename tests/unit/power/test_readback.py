"""power-control's read-back of nodes whose last command has not reached its result (pure)."""

from __future__ import annotations

from powerguard.power_control.readback import ReadBack, meaning


def test_a_node_is_read_back_until_its_result_is_reported_and_never_while_its_sequence_runs():
    rb = ReadBack(interval_s=10, window_s=100)
    rb.expect("n2", "s1", "ready", now=0)
    assert rb.due(5) == []  # not yet
    assert rb.due(10, busy={"n2"}) == []  # its power-on sequence still runs: left to it
    [(node, exp)] = rb.due(11)
    assert (node, exp.saga_id, exp.want) == ("n2", "s1", "ready")
    assert rb.due(12) == []  # next read one interval later
    rb.reported("n2", "off")  # not what the saga waits for
    assert "n2" in rb
    rb.reported("n2", "ready")
    assert "n2" not in rb and rb.due(100) == []


def test_the_newest_command_wins_and_the_window_ends_the_watch():
    rb = ReadBack(interval_s=1, window_s=50)
    rb.expect("n1", "s1", "ready", now=0)
    rb.expect("n1", "s2", "off", now=5)  # power failed again: the new saga shuts it down
    [(_, exp)] = rb.due(6)
    assert (exp.saga_id, exp.want) == ("s2", "off")
    assert rb.due(60) == [] and "n1" not in rb


def test_what_a_read_back_means():
    assert meaning("off", "off", None) == "off"
    assert meaning("off", "on", None) is None
    assert meaning("ready", "on", None) == "ready"  # no probe configured: on is ready
    assert meaning("ready", "on", False) is None  # the probe says not yet
    assert meaning("ready", "unknown", None) is None
