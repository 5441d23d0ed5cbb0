"""The coordinator's site core, without NATS: routing, saga start, status flags, drills and
result matching, fed with the same event envelopes the service receives."""

from __future__ import annotations

from powerguard.coordinator.outbox import command_event
from powerguard.schemas import JobData, JobRestarted, LowBattery, PowerActionFailed, PowerData, PowerResultData

from .harness import POLICY
from .site import Site, at


def test_a_saga_starts_for_the_nodes_whose_every_feed_is_on_battery():
    s = Site()
    step = s.send(s.power("B", True))  # n4 has only B; n3 (A+B) still has A
    assert step.started == ["s1"] and s.core.open["s1"].at_risk == ["n4"]
    assert s.kinds(step) == [("ckpt_request", "j3")]


def test_one_healthy_feed_keeps_a_node_out_of_the_saga():
    s = Site()
    step = s.send(s.power("A", True))
    rec = s.core.open["s1"]
    assert step.started == ["s1"] and rec.at_risk == ["n1", "n2"]
    assert ("ckpt_request", "j1") in s.kinds(step) and ("ckpt_request", "j2") not in s.kinds(step)


def test_events_the_site_cannot_use_are_set_aside_with_a_reason():
    s = Site()
    s.send(s.power("Z", True))  # not in the topology
    s.send(s.power("A", True, age_s=10_000))  # older than max_event_age_s
    assert s.core.open == {} and s.notices() == ["unknown_ups", "stale"]
    s.send(s.power("A", True))
    s.send(s.power("A", False, age_s=5))  # a late copy: the UPS said more since
    assert s.notices()[-1] == "late" and s.core.ups["A"].on_battery


def test_low_battery_flag_counts_only_on_battery():
    s = Site()
    recharging = PowerData(site="dc1", ups="A", on_battery=False, status=["OL", "CHRG", "LB"], charge_pct=5.0)
    s.send(LowBattery(time=at(s.now), data=recharging))
    assert not s.core.ups["A"].low_battery and s.core.open == {}
    s.send(s.power("A", True, status=["OB", "LB"]))
    assert s.core.ups["A"].low_battery and s.core.open["s1"].ups["A"].low_battery


def test_real_on_line_telemetry_does_not_end_a_drill_and_a_real_outage_gets_its_own_real_saga():
    s = Site()
    s.send(s.power("A", True, drill=True))
    drill = s.core.open["s1"]
    assert drill.drill and s.core.drill_ups["A"].drill and "A" not in s.core.ups
    s.send(s.power("A", False))  # the UPS's own poller: still on line
    assert s.core.drill_ups["A"].on_battery and drill.state.value != "cancelled"
    step = s.send(s.power("A", True))  # mains really fails during the drill
    real = s.core.open["s2"]
    assert not real.drill and real.at_risk == ["n1", "n2"], "a real outage must get a real saga"
    assert drill.state.value == "cancelled" and "real outage (saga s2)" in drill.reason
    assert ("ckpt_request", "j1") in s.kinds(step) and step.commands["s2"][0].kind == "ckpt_request"


def test_a_drill_on_line_stamped_a_day_ahead_hides_no_real_reading():
    """The operator's attack: one drill reading stamped in the future made every real reading of
    that UPS "older than its newest", so a real outage got no saga."""
    s = Site()
    s.send(s.power("A", False, drill=True, age_s=-86_400))
    assert s.notices() == ["future"]
    s.send(s.power("A", False, drill=True, age_s=-30))  # within the skew: applied, and it hides nothing
    s.send(s.power("A", True, runtime_s=40))
    assert [r.drill for r in s.core.open.values()] == [False], "the real outage got no saga"


def test_a_real_reading_stamped_ahead_within_the_skew_never_hides_the_next_ones():
    s = Site()
    s.send(s.power("A", False, age_s=-60))  # ups-monitor's clock a minute ahead, then set right
    s.send(s.power("A", True))
    assert "late" not in s.notices() and list(s.core.open) == ["s1"]


def test_a_drill_on_line_during_a_real_outage_cancels_nothing_real():
    s = Site()
    s.send(s.power("A", True))
    s.send(s.power("A", True, drill=True))  # a drill of the same UPS: nothing of it is at risk
    s.send(s.power("A", False, drill=True))
    assert list(s.core.open) == ["s1"] and s.core.open["s1"].state.value == "checkpointing"


def test_a_drill_status_of_one_second_sends_no_real_shutdown():
    s = Site()
    s.send(s.power("A", True, runtime_s=600))
    s.send(*s.acks("s1", "j1"))
    step = s.send(s.power("A", True, drill=True, runtime_s=1))
    assert s.core.open["s1"].state.value == "holding" and not [k for k in s.kinds(step) if k[0] == "shutdown"]


def test_acks_go_to_the_saga_they_name_and_no_other():
    s = Site()
    s.send(s.power("A", True))
    s.send(*[a.model_copy(update={"data": a.data.model_copy(update={"saga_id": "other"})}) for a in s.acks("s1", "j1")])
    assert s.core.open["s1"].jobs["j1"].acked == {} and s.notices().count("unknown_saga") == 4
    s.send(*s.acks("s1", "j1"))
    assert s.core.open["s1"].state.value == "holding"


def shut_down(s: Site) -> None:
    s.send(s.power("A", True))
    s.send(*s.acks("s1", "j1"))
    s.send(s.power("A", True, runtime_s=50))  # below the reserve: stop now
    assert s.core.open["s1"].state.value == "shutting_down"


def test_power_results_are_matched_by_saga_id_not_by_node():
    s = Site()
    shut_down(s)
    s.send(s.node("n1", "off", None), s.node("n2", "off", "an-old-saga"))
    assert s.core.open["s1"].state.value == "shutting_down", "results of no saga or another saga counted"
    s.send(s.node("n1", "off", "s1"), s.node("n2", "off", "s1"))
    assert s.core.open["s1"].state.value == "down"


def test_a_failed_power_off_is_recorded_with_its_reason():
    s = Site()
    shut_down(s)
    failed = PowerResultData(saga_id="s1", node="n1", action="off", error="BMC unreachable")
    step = s.send(PowerActionFailed(data=failed), s.node("n2", "off", "s1"))
    rec = s.core.open["s1"]
    # the off is commanded again (a new key: power-control falls back to the outlets on a retry)
    assert rec.state.value == "shutting_down" and rec.nodes["n1"].error == "BMC unreachable"
    again = step.commands["s1"]
    assert [(c.kind, c.target, c.key, c.args["retry"]) for c in again] == [("shutdown", "n1", "s1/n1/shutdown.r1", 1)]
    s.send(PowerActionFailed(data=failed))
    # retries spent: never "down" while a node's off failed; the reason names it
    assert rec.state.value == "partly_down"
    assert "off failed on n1 (BMC unreachable): its power state is unknown; off: n2" in rec.reason
    s.send(s.node("n1", "off", "s1", detail="read back by power-control"))  # it is off after all
    assert rec.state.value == "down" and rec.nodes["n1"].error is None


def restore_started(s: Site) -> None:
    shut_down(s)
    s.send(s.node("n1", "off", "s1"), s.node("n2", "off", "s1"))
    s.send(s.power("A", False))
    s.advance(s.policy.restore_stable_s + 1)
    assert s.core.open["s1"].state.value == "restoring"


def restore(s: Site) -> None:
    shut_down(s)
    s.send(s.node("n1", "off", "s1"), s.node("n2", "off", "s1"))
    s.send(s.power("A", False))
    s.advance(s.policy.restore_stable_s + 1)
    s.send(s.node("n1", "ready", "s1"), s.node("n2", "ready", "s1"))
    assert s.core.open["s1"].state.value == "restoring"


def test_resumed_matches_its_saga_or_falls_back_to_the_saga_restoring_the_job():
    s = Site()
    restore(s)
    s.send(s.resumed("j2", "s1"))  # not a job of this saga
    assert s.core.open["s1"].jobs["j1"].resumed_at is None and s.notices()[-1] == "unmatched"
    s.send(s.resumed("j1", None))  # an agent restarted without POWERGUARD_SAGA
    assert "s1" not in s.core.open and s.steps[-1].changed[0].state.value == "done"


def test_a_real_restart_is_not_a_resume_but_a_drills_dry_run_restart_is():
    s = Site()
    restore(s)
    s.send(JobRestarted(data=JobData(job="j1", saga_id="s1")))
    assert s.core.open["s1"].state.value == "restoring"
    s.send(JobRestarted(data=JobData(job="j1", saga_id="s1", dry_run=True)))  # not a drill saga
    assert s.core.open["s1"].state.value == "restoring" and "unmatched" in s.notices()


def test_power_failing_again_while_restoring_is_protected_at_once():
    """The restoring saga does not look at power: a new outage must not wait for it to end."""
    s = Site()
    restore(s)
    step = s.send(s.power("A", True))  # fails again before j1 resumed
    assert step.started == ["s2"] and s.kinds(step) == [("ckpt_request", "j1")]
    states = {r.saga_id: r.state.value for r in step.changed}
    assert states == {"s1": "failed", "s2": "checkpointing"}
    old = next(r for r in step.changed if r.saga_id == "s1")
    assert old.reason.startswith("superseded by s2: power failed again during the restore")
    assert old.superseded_by == "s2" and list(s.core.open) == ["s2"]


def test_a_stuck_restore_never_blocks_the_next_outage_and_its_restore_is_carried():
    """n2's power-on failed (no IPMI answer); the saga waits for it (restore_timeout_s) while
    the UPS goes on battery again with j1 training on n1: checkpoint, shutdown, and later a
    restore of both nodes and the job, by the new saga."""
    s = Site()
    restore_started(s)
    failed = PowerResultData(saga_id="s1", node="n2", action="on", error="bmc:n2: no IPMI answer")
    s.send(s.node("n1", "ready", "s1"), PowerActionFailed(data=failed))
    s.advance(60)
    assert s.core.open["s1"].state.value == "restoring"
    step = s.send(s.power("A", True, runtime_s=100))
    assert step.started == ["s2"] and ("ckpt_request", "j1") in s.kinds(step)
    s2 = s.core.open["s2"]
    assert s2.at_risk == ["n1", "n2"] and "s1" not in s.core.open
    s.send(*s.acks("s2", "j1"))
    step = s.send(s.power("A", True, runtime_s=50))  # below the reserve
    assert sorted(t for k, t in s.kinds(step) if k == "shutdown") == ["n1", "n2"]
    s.send(s.node("n1", "off", "s2"), s.node("n2", "off", "s2"), s.power("A", False))
    step = s.advance(s.policy.restore_stable_s + 1)
    assert sorted(t for k, t in s.kinds(step) if k == "power_on") == ["n1", "n2"]


def test_a_second_ups_failing_while_one_saga_is_down_starts_a_saga_beside_it():
    """n1, n2 are off (saga s1, feed A still out); B fails: n4 is at risk and only n4 joins the
    new saga (n3 is fed by A+B and was never shut down: it joins too); nothing is shut down twice."""
    s = Site()
    shut_down(s)
    s.send(s.node("n1", "off", "s1"), s.node("n2", "off", "s1"))
    assert s.core.open["s1"].state.value == "down"
    step = s.send(s.power("B", True))
    assert step.started == ["s2"]
    s2 = s.core.open["s2"]
    assert s2.at_risk == ["n3", "n4"] and s.core.open["s1"].state.value == "down"
    s.send(*s.acks("s2", "j2"), *s.acks("s2", "j3"))
    s.send(s.power("B", True, runtime_s=50))
    shut = [
        t
        for st in s.steps
        for sid, cmds in st.commands.items()
        for c in cmds
        if c.kind == "shutdown"
        for t in [c.target]
    ]
    assert sorted(shut) == ["n1", "n2", "n3", "n4"], "a node shut down twice or not at all"


def test_resume_takes_over_open_sagas_and_says_what_to_send_again():
    s = Site()
    s.send(s.power("A", True))
    rec = s.core.open["s1"].model_copy(deep=True)
    fresh = Site()
    again = fresh.core.resume([rec])
    assert [c.kind for c in again["s1"]] == ["ckpt_request"] and fresh.core.ups["A"].on_battery


def test_a_resume_naming_an_older_outage_counts_for_the_saga_restoring_the_job():
    """The newest checkpoint may come from an earlier outage (this one's failed): the job
    resumed all the same, and the restoring saga must not wait for it until its timeout."""
    s = Site()
    restore(s)
    s.send(s.resumed("j1", "dc1-20250101T000000-abcd"))
    assert "s1" not in s.core.open and s.steps[-1].changed[0].state.value == "done"


def test_a_required_durability_holds_the_shutdown_until_the_acks_reach_it_or_the_deadline():
    s = Site(policy=POLICY.model_copy(update={"require_durability": "replicated"}))
    s.send(s.power("A", True))
    s.send(*s.acks("s1", "j1"))  # durable on each node's own disk only
    plan = s.core.open["s1"].jobs["j1"]
    assert plan.settled_at is None and plan.short == [0, 1, 2, 3]  # acked, not yet replicated: still waiting
    s.send(*s.acks("s1", "j1", durability="replicated:1"))  # the replicas are on a peer now
    assert plan.settled_at is not None and plan.short == [] and plan.complete
    s2 = Site(policy=POLICY.model_copy(update={"require_durability": "remote"}))
    s2.send(s2.power("A", True))
    s2.send(*s2.acks("s1", "j1", durability="replicated:2"))
    assert s2.core.open["s1"].jobs["j1"].settled_at is None  # replicas are not the remote tier
    s2.advance(POLICY.ckpt_timeout_s + 1)  # the deadline settles it: the battery bounds the wait
    p2 = s2.core.open["s1"].jobs["j1"]
    assert p2.settled_at is not None and p2.short == [0, 1, 2, 3] and p2.missing == []


def test_a_node_held_by_the_power_on_ramp_is_recorded_from_its_state_event():
    s = Site()
    restore_started(s)
    s.send(s.node("n1", "off", "s1", "power-on ramp: starts in 3.0s"))
    assert s.core.open["s1"].nodes["n1"].waiting == "power-on ramp: starts in 3.0s"
    s.send(s.node("n1", "ready", "s1"))
    assert s.core.open["s1"].nodes["n1"].waiting is None


def test_rank_0s_one_ack_for_the_job_answers_for_every_rank_it_names_once():
    s = Site()
    s.send(s.power("A", True))
    (request,) = [c for c in s.commands if c.kind == "ckpt_request" and c.target == "j1"]
    assert command_event(s.core.open["s1"], request).data.acks == "job"  # the coordinator asks for it
    s.send(s.ack("s1", "j1", 0, ranks=[(0, 1)]))  # two of the four ranks: not yet every rank
    plan = s.core.open["s1"].jobs["j1"]
    assert plan.acked == {0: 101, 1: 101} and plan.settled_at is None
    s.send(s.ack("s1", "j1", 0, ranks=[(0, 3)]))  # rank 0 speaks for the job once per request and level
    assert plan.acked == {0: 101, 1: 101} and s.notices() == ["repeated"]
    s.send(s.ack("s1", "j1", 2), s.ack("s1", "j1", 3))  # the others' own acks count as ever
    assert plan.settled_at is not None
    assert s.core.open["s1"].state.value == "holding"
    one = Site()
    one.send(one.power("A", True))
    one.send(one.ack("s1", "j1", 0, ranks=[(0, 2), (3, 7)]))  # every rank (beyond its world: nobody's)
    assert one.core.open["s1"].jobs["j1"].acked == dict.fromkeys(range(4), 101)
    assert one.core.open["s1"].state.value == "holding"


def test_a_jobs_agent_cannot_make_one_message_count_its_ranks_again_and_again():
    """Rank 0's ack for the job expands to the job's ranks: taken once per request and level,
    so a job's own (least trusted) credential cannot make each of its messages cost the
    coordinator its whole world again."""
    s = Site()
    s.send(s.power("A", True))
    plan = s.core.open["s1"].jobs["j1"]
    s.send(*[s.ack("s1", "j1", 0, ranks=[(0, 3)], durability="replicated:1") for _ in range(50)])
    assert s.notices().count("repeated") == 49 and set(plan.levels.values()) == {"replicated:1"}


def test_one_jobs_ack_naming_another_jobs_request_never_stands_for_that_job():
    """Job j1's agent may publish only on j1's subjects, but it writes the request id: an ack of
    j1 naming j2's request (ids are ``<saga>/<job>/ckpt``) is set aside, and j2's own ack for its
    ranks is answered as if j1 had said nothing (it was recorded as already spoken before)."""
    s = Site()
    s.send(s.power("A", True), s.power("B", True))
    rec = s.core.open["s1"]
    assert {"j1", "j2"} <= set(rec.jobs)
    forged = [
        a.model_copy(update={"data": a.data.model_copy(update={"request_id": rec.jobs["j2"].request_id})})
        for a in (s.ack("s1", "j1", 0, ranks=[(0, 3)], durability=lv) for lv in ("local", "replicated:1", "remote"))
    ]
    s.send(*forged)
    assert s.notices().count("unmatched") == 3 and rec.jobs["j1"].acked == {}
    s.send(s.ack("s1", "j2", 0, ranks=[(0, 1)]))
    assert rec.jobs["j2"].acked == {0: 101, 1: 101} and rec.jobs["j2"].settled_at is not None
    assert "repeated" not in s.notices()


def test_a_readings_age_is_the_time_the_server_stored_it_never_its_publishers_stamp():
    """A reading stored long ago (a replayed history) is stale whatever its stamp says; one stamped
    far off by a publisher whose clock is wrong, stored just now, is a reading of now."""
    s = Site()
    old = s.core.apply([(s.power("A", True), None, s.now - 86_400)], s.now)
    assert [n.reason for n in old.notices] == ["stale"] and not s.core.open
    skewed = s.core.apply([(s.power("A", True, age_s=-100.0), None, s.now)], s.now)
    assert skewed.started and not skewed.notices
    behind = Site()
    got = behind.core.apply([(behind.power("A", True, age_s=150.0), None, behind.now)], behind.now)
    assert got.started and not got.notices
