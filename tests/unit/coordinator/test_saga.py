"""Every transition of the saga, without NATS."""

from __future__ import annotations

import pytest

from powerguard.coordinator import budget, commands, figures, inputs, record
from powerguard.coordinator.topology import Topology

from .harness import POLICY, TOPO, Drive


def test_on_battery_requests_a_checkpoint_from_every_job_at_risk():
    d = Drive()
    cmds = d.power("A", True, runtime_s=300)
    assert d.state == "checkpointing"
    assert d.rec.at_risk == ["n1", "n2"]  # n3 has feed B, n4 is on B
    assert d.kinds(cmds) == [("ckpt_request", "j1")]
    assert cmds[0].key == "s1/j1/ckpt" and cmds[0].args["request_id"] == "s1/j1/ckpt"
    assert cmds[0].args["deadline"] == d.now + 120  # min(ckpt_timeout 120, 300 - 60 - 10)


def test_deadline_comes_from_the_battery_when_it_is_shorter():
    d = Drive()
    cmds = d.power("A", True, runtime_s=100)
    assert cmds[0].args["deadline"] == d.now + 30  # 100 - 60 - 10


def test_no_saga_when_no_node_is_at_risk():
    d = Drive(topo=Topology(site="dc1", feeds={"n3": ("A", "B")}))
    assert d.power("A", True) == [] and d.rec is None  # n3 still has feed B


def test_every_rank_acks_then_hold_without_shutdown():
    d = Drive()
    d.power("A", True)
    assert d.ack("j1", 0) == [] and d.state == "checkpointing"
    for r in (1, 2, 3):
        d.ack("j1", r)
    assert d.state == "holding"
    assert [t.state.value for t in d.rec.history] == ["detected", "checkpointing", "checkpointed", "holding"]
    assert d.advance(60) == []
    assert d.state == "holding"


def test_deadline_passes_first_partial_records_missing_ranks():
    d = Drive()
    d.power("A", True)
    d.ack("j1", 0)
    d.ack("j1", 2)
    d.advance(119)
    assert d.state == "checkpointing"
    d.advance(1)
    assert d.state == "holding"
    assert d.rec.history[-2].state.value == "partial"
    assert d.rec.jobs["j1"].missing == [1, 3]
    assert "j1 ranks 1,3" in d.rec.history[-2].reason
    d.ack("j1", 1)  # late ack after the deadline: the decision stands
    assert d.rec.jobs["j1"].missing == [1, 3]


def test_a_failed_rank_settles_the_round_at_once_and_the_job_is_asked_again_until_the_retries_are_spent():
    d = Drive(policy=POLICY.model_copy(update={"ckpt_retries": 2}))
    d.power("A", True)
    for attempt, rid in ((1, "s1/j1/ckpt"), (2, "s1/j1/ckpt.2")):
        for r in (0, 1, 2):
            d.ack("j1", r, request_id=rid)
        cmds = d.ack("j1", 3, ok=False, request_id=rid)
        # a new round: its own request id and command key, the deadline within the budget
        assert d.state == "checkpointing", attempt
        assert [(c.kind, c.key, c.args["request_id"]) for c in cmds] == [
            ("ckpt_request", f"s1/j1/ckpt.{attempt + 1}", f"s1/j1/ckpt.{attempt + 1}")
        ]
        assert cmds[0].args["deadline"] <= d.now + 300 - 60 - 10
        assert "attempt" in d.rec.reason and "rank 3: disk full" in d.rec.reason
    assert d.ack("j1", 0, request_id="s1/j1/ckpt") == []  # an ack of an earlier round does not count
    for r in (0, 1, 2):
        d.ack("j1", r, request_id="s1/j1/ckpt.3")
    d.ack("j1", 3, ok=False, request_id="s1/j1/ckpt.3")
    assert d.state == "holding" and d.rec.history[-2].state.value == "partial"
    assert d.rec.jobs["j1"].failed == {3: "disk full"} and d.rec.jobs["j1"].attempt == 3


def test_a_retried_power_checkpoint_that_succeeds_counts_as_the_jobs_checkpoint():
    d = Drive()
    d.power("A", True)
    d.ack("j1", 0, ok=False)
    for r in (1, 2, 3):
        d.ack("j1", r)
    assert d.state == "checkpointing"
    for r in range(4):
        d.ack("j1", r, request_id="s1/j1/ckpt.2", step=120)
    assert d.state == "holding" and d.rec.jobs["j1"].complete and d.rec.jobs["j1"].step == 120


def test_no_retry_without_the_battery_for_it():
    d = Drive()
    d.power("A", True, runtime_s=70.5)  # 0.5 s of budget: below a second, no new round
    d.ack("j1", 0, ok=False)
    for r in (1, 2, 3):
        d.ack("j1", r)
    assert d.rec.jobs["j1"].attempt == 1 and d.state != "checkpointing"


def test_shutdown_when_runtime_falls_below_the_reserve():
    d = Drive()
    d.power("A", True, runtime_s=300)
    d.ack_all("j1")
    assert d.power("A", True, runtime_s=61) == []
    cmds = d.power("A", True, runtime_s=59)
    assert d.state == "shutting_down"
    assert d.kinds(cmds) == [("job_stop", "j1"), ("shutdown", "n1"), ("shutdown", "n2")]
    assert cmds[1].key == "s1/n1/shutdown" and cmds[1].args["jobs"] == ["j1"]


@pytest.mark.parametrize("kind", ["low_battery", "fsd", "max_on_battery"])
def test_other_shutdown_triggers(kind):
    d = Drive()
    d.power("A", True, runtime_s=3000)
    d.ack_all("j1")
    if kind == "max_on_battery":
        d.advance(POLICY.max_on_battery_s)
    else:
        d.power("A", True, runtime_s=3000, **{kind: True})
    assert d.state == "shutting_down"


def test_low_battery_before_acks_complete_waits_for_acks_within_the_budget():
    d = Drive()
    d.power("A", True, runtime_s=300)
    d.ack("j1", 0)
    d.power("A", True, runtime_s=90, low_battery=True)  # budget: 90 - 60 - 10 = 20 s
    assert d.state == "checkpointing"
    assert d.rec.jobs["j1"].deadline == d.now + 20
    d.advance(10)
    assert d.state == "checkpointing"  # still waiting for acks, inside the budget
    d.advance(10)
    assert d.state == "shutting_down"  # the budget decided: partial, then straight to shutdown
    states = [t.state.value for t in d.rec.history]
    assert states[-3:] == ["partial", "holding", "shutting_down"]


def test_low_battery_and_all_acks_shut_down_at_once():
    d = Drive()
    d.power("A", True, runtime_s=300)
    d.power("A", True, runtime_s=100, low_battery=True)
    for r in range(4):
        d.ack("j1", r)
    assert d.state == "shutting_down"


def test_low_battery_without_runtime_leaves_no_budget():
    d = Drive()
    d.power("A", True, runtime_s=None, low_battery=True)
    assert d.state == "shutting_down"
    assert d.rec.jobs["j1"].missing == [0, 1, 2, 3]


def test_multi_feed_node_is_at_risk_only_when_every_feed_is_on_battery():
    d = Drive()
    d.power("A", True)
    assert "n3" not in d.rec.at_risk
    cmds = d.power("B", True)  # now n3 (A+B) and n4 (B) are at risk: they join the saga
    assert d.rec.at_risk == ["n1", "n2", "n3", "n4"]
    assert sorted(d.kinds(cmds)) == [("ckpt_request", "j2"), ("ckpt_request", "j3")]
    d.ack_all("j1")
    d.ack_all("j2")
    assert d.state == "checkpointing"
    d.ack_all("j3")
    assert d.state == "holding"
    d.power("B", False)  # B back: n3 and n4 safe again
    assert d.rec.at_risk == ["n1", "n2"]
    cmds = d.power("A", True, runtime_s=10)
    assert ("shutdown", "n3") not in d.kinds(cmds) and ("shutdown", "n4") not in d.kinds(cmds)
    assert ("shutdown", "n1") in d.kinds(cmds)


def test_joining_during_holding_goes_back_to_checkpointing():
    d = Drive()
    d.power("A", True)
    d.ack_all("j1")
    assert d.state == "holding"
    d.power("B", True)
    assert d.state == "checkpointing"
    d.power("A", True, runtime_s=200)  # budget 130 s: the new jobs are waited for
    assert d.state == "checkpointing"
    d.ack_all("j2")
    d.ack_all("j3")
    assert d.state == "holding"


def test_the_worst_node_sets_the_budget_of_the_whole_saga():
    d = Drive()
    d.power("A", True)
    d.ack_all("j1")
    d.power("B", True)
    cmds = d.power("A", True, runtime_s=30)  # n1/n2 must go now; j2/j3 get no more time
    assert d.state == "shutting_down"
    assert d.rec.jobs["j2"].missing == [0, 1]
    assert ("shutdown", "n1") in d.kinds(cmds)


@pytest.mark.parametrize("phase", ["checkpointing", "holding", "partial-holding"])
def test_flap_before_shutdown_cancels_the_saga(phase):
    d = Drive()
    d.power("A", True)
    if phase == "holding":
        d.ack_all("j1")
    if phase == "partial-holding":
        d.advance(200)
    cmds = d.power("A", False)
    assert d.state == "cancelled" and cmds == []
    assert not any(c.kind in ("shutdown", "job_stop") for c in d.commands)
    assert d.advance(10_000) == []  # terminal: nothing more


def _to_down(d: Drive) -> None:
    d.power("A", True)
    d.ack_all("j1")
    d.power("A", True, runtime_s=50)
    d.node("n1", "off")
    d.node("n2", "off")


def test_shutting_down_until_every_node_reports_off():
    d = Drive()
    d.power("A", True)
    d.ack_all("j1")
    d.power("A", True, runtime_s=50)
    d.node("n1", "off")
    assert d.state == "shutting_down"
    d.node("n2", "failed_off")  # without a detail it failed all the same (was taken for an off: "down")
    assert d.state == "shutting_down" and d.kinds(d.commands[-1:]) == [("shutdown", "n2")]  # the off again
    d.node("n2", "off")
    assert d.state == "down"
    assert d.rec.nodes["n2"].off_at is not None and d.rec.nodes["n2"].error is None


def test_shutdown_timeout_moves_on_and_names_the_silent_node():
    d = Drive()
    d.power("A", True)
    d.ack_all("j1")
    d.power("A", True, runtime_s=50)
    d.node("n1", "off")
    d.advance(POLICY.shutdown_timeout_s)
    assert d.state == "partly_down" and "n2" in d.rec.reason  # never "down" with a node unaccounted for


def test_power_race_finishes_the_shutdown_then_restores():
    d = Drive()
    d.power("A", True)
    d.ack_all("j1")
    d.power("A", True, runtime_s=50)
    d.power("A", False)  # power back while shutting down
    assert d.state == "shutting_down"
    d.node("n1", "off")
    d.node("n2", "off")
    assert d.state == "down"
    d.advance(29)
    assert d.state == "down"
    cmds = d.advance(1)
    assert d.state == "restoring"
    assert d.kinds(cmds) == [("power_on", "n1"), ("power_on", "n2")]


def test_restore_waits_for_stable_power_and_charge_then_restarts_and_resumes():
    d = Drive()
    _to_down(d)
    d.advance(100)
    d.power("A", False, charge_pct=20)
    d.advance(31)
    assert d.state == "down"  # charge below min_restart_charge_pct
    d.power("A", True)  # flaps again: the stable timer restarts
    d.power("A", False, charge_pct=40)
    d.advance(29)
    assert d.state == "down"
    cmds = d.advance(1)
    assert d.kinds(cmds) == [("power_on", "n1"), ("power_on", "n2")]
    assert d.node("n1", "ready") == []
    cmds = d.node("n2", "ready")
    assert d.kinds(cmds) == [("job_restart", "j1")] and cmds[0].args["nodes"] == ["n1", "n2"]
    d.advance(5)
    d.resumed("j1", step=101)
    assert d.state == "done"
    assert [t.state.value for t in d.rec.history][-3:] == ["restoring", "resumed", "done"]
    assert figures.rpo_steps(d.rec) == 0  # stopped at 101 (the checkpoint), resumed from 101
    assert figures.rto_s(d.rec) == pytest.approx(35.0)


def test_nodes_held_back_by_the_power_on_ramp_show_in_the_status():
    from powerguard.coordinator.status import status_of

    d = Drive()
    _to_down(d)
    d.advance(100)
    d.power("A", False, charge_pct=90)
    d.advance(31)
    assert d.state == "restoring"
    d.node("n2", "off", "power-on ramp: starts in 4.0s")  # power-control's word while the ramp holds n2
    d.node("n1", "ready")
    assert status_of(d.rec, now=d.now).row(d.now)["restore"] == {
        "asked": 2,
        "ready": 1,
        "in_ramp": 1,
        "ramp": "power-on ramp: starts in 4.0s",
    }
    d.node("n2", "ready")
    assert status_of(d.rec, now=d.now).row(d.now)["restore"]["in_ramp"] == 0
    assert d.rec.nodes["n2"].off_at is not None and d.rec.nodes["n2"].ready_at is not None


def test_restore_timeout_fails_with_a_reason():
    d = Drive()
    _to_down(d)
    d.power("A", False)
    d.advance(30)
    d.node("n1", "ready")
    d.advance(POLICY.restore_timeout_s)
    assert d.state == "failed" and "n2" in d.rec.reason


def test_bad_acks_change_nothing():
    d = Drive()
    d.power("A", True)
    before = d.rec.model_dump()
    d.ack("nope", 0)
    d.ack("j1", 9)
    d.ack("j1", 0, request_id="other-saga/j1/ckpt")
    d.ack("j2", 0)  # j2 is not in this saga
    after = d.rec.model_dump()
    assert {k: v for k, v in before.items() if k != "updated_at"} == {
        k: v for k, v in after.items() if k != "updated_at"
    }


def test_pending_rederives_what_to_send_again():
    d = Drive()
    d.power("A", True)
    assert [c.key for c in commands.pending(d.rec, POLICY)] == ["s1/j1/ckpt"]
    d.ack_all("j1")
    assert commands.pending(d.rec, POLICY) == []
    d.power("A", True, runtime_s=50)
    d.node("n1", "off")
    assert [c.key for c in commands.pending(d.rec, POLICY)] == ["s1/j1/stop", "s1/n2/shutdown"]
    d.node("n2", "off")
    d.power("A", False)
    d.advance(30)
    d.node("n2", "ready")
    assert [c.key for c in commands.pending(d.rec, POLICY)] == ["s1/n1/power_on"]


def test_a_resent_command_is_the_command_first_sent():
    """pending() and the first send build commands with the same functions: keys and arguments."""
    d = Drive()
    d.power("A", True)
    d.ack_all("j1")
    first = d.power("A", True, runtime_s=50)  # the stop: job_stop and every shutdown
    again = commands.pending(record.SagaRecord.model_validate_json(d.rec.model_dump_json()), POLICY)
    assert [(c.kind, c.key, c.args) for c in again] == [(c.kind, c.key, c.args) for c in first]
    for n in ("n1", "n2"):
        d.node(n, "off")
    d.power("A", False)
    first = d.advance(31)  # power-on of every node
    again = commands.pending(d.rec, POLICY)
    assert [(c.kind, c.key, c.args) for c in again] == [(c.kind, c.key, c.args) for c in first]


def test_record_round_trips_through_json():
    d = Drive()
    d.power("A", True)
    d.ack("j1", 0)
    back = record.SagaRecord.model_validate_json(d.rec.model_dump_json())
    assert back == d.rec


def test_a_batch_of_inputs_counts_power_readings_in_order():
    d = Drive()
    d.power("A", True)
    d.ack_all("j1")
    low = inputs.Power(ups="A", on_battery=True, runtime_s=40)
    back = inputs.Power(ups="A", on_battery=False, runtime_s=600, charge_pct=90)
    d.ups["A"].on_battery = False
    cmds = d.send([low, back])  # the coordinator was busy: both readings arrive together
    assert d.state == "shutting_down"  # the low reading decided before power came back (power race)
    assert ("shutdown", "n1") in d.kinds(cmds)


def test_a_batch_of_acks_settles_like_one_by_one():
    d = Drive()
    d.power("A", True)
    acks = [inputs.Ack(job="j1", rank=r, request_id="s1/j1/ckpt", step=101) for r in range(4)]
    d.send(acks)
    assert d.state == "holding" and d.rec.jobs["j1"].missing == []


def test_outlook_uses_the_sagas_own_budget_rules():
    """`powerguard drill` and status ask the saga's rules, not a copy of the formula."""
    views = {"A": record.UpsView(on_battery=True, runtime_s=100.0), "B": record.UpsView()}
    o = budget.outlook(views, TOPO, POLICY)
    assert (o.budget_s, o.runtime_s, o.stop_at_runtime_s) == (30.0, 100.0, 60.0)  # 100 - reserve 60 - margin 10
    views["A"].fsd = True
    assert budget.outlook(views, TOPO, POLICY).budget_s == 0.0
    at_stop = POLICY.model_copy(update={"hold_policy": "checkpoint-at-stop"})
    o = budget.outlook({"A": record.UpsView(on_battery=True, runtime_s=500.0)}, TOPO, at_stop, checkpoint_s=20.0)
    assert o.stop_at_runtime_s == 60 + 10 + at_stop.final_ckpt_factor * 20.0  # room for the final checkpoint


def test_a_shrunk_deadline_is_sent_to_the_ranks():
    """The battery budget shrinks the coordinator's deadline; the ranks hear it (the request
    again, same request id, the earlier deadline), so neither side waits on the other."""
    d = Drive()
    (req,) = d.power("A", True, runtime_s=200)  # budget min(120, 200 - 60 - 10) = 120
    assert req.args["deadline"] == d.now + 120
    assert d.power("A", True, runtime_s=189) == []  # 1 s shorter: not worth a message
    d.now += 1
    (update,) = d.power("A", True, runtime_s=150)  # budget 80 s from now
    assert update.kind == "ckpt_request" and update.args["request_id"] == req.args["request_id"]
    assert update.args["deadline"] == d.now + 80 and update.key != req.key
