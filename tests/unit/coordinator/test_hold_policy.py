"""The hold policies and the honest work-lost figures, on the pure saga."""

from __future__ import annotations

from powerguard.coordinator import commands, figures, record
from powerguard.schemas import AgentData

from .harness import POLICY, Drive

AT_STOP = POLICY.model_copy(update={"hold_policy": "checkpoint-at-stop"})
PAUSE = POLICY.model_copy(update={"hold_policy": "pause"})


def checkpointed(d: Drive, took_s: float, step: int = 101) -> None:
    """On battery (A), j1's power checkpoint takes ``took_s``."""
    d.power("A", True, runtime_s=300)
    d.advance(took_s)
    for r in range(4):
        d.ack("j1", r, step=step)
    assert d.state == "holding"


def heartbeat(d: Drive, job: str, step: int, world: int = 4) -> None:
    for r in range(world):
        d.reg.update(AgentData(job=job, rank=r, world_size=world, node="n1" if r < 2 else "n2", step=step))


def test_final_checkpoint_when_the_budget_left_falls_to_twice_the_measured_checkpoint():
    d = Drive(policy=AT_STOP)
    checkpointed(d, took_s=2.0)
    assert d.power("A", True, runtime_s=75) == []  # 5 s left before reserve + margin > 2 x 2 s
    cmds = d.power("A", True, runtime_s=74)  # 4 s left: time for the final checkpoint
    assert d.state == "final_checkpoint"
    assert d.kinds(cmds) == [("ckpt_request", "j1")]
    final = cmds[0]
    assert final.key == "s1/j1/final" and final.args["reason"] == "final" and final.args["then"] == "pause"
    assert final.args["deadline"] == d.now + 4 and final.args["request_id"] == "s1/j1/final"
    assert d.ack("j1", 0, request_id="s1/j1/ckpt", step=150) == []  # the power round's id does not count
    for r in range(3):
        d.ack("j1", r, request_id="s1/j1/final", step=150, commit="c" * 32 if r == 0 else None)
    assert d.state == "final_checkpoint"
    cmds = d.ack("j1", 3, request_id="s1/j1/final", step=150)
    assert d.state == "shutting_down"
    # the step every rank made durable is announced first (a restore never picks an older one)
    assert d.kinds(cmds) == [("ckpt_recorded", "j1"), ("job_stop", "j1"), ("shutdown", "n1"), ("shutdown", "n2")]
    assert cmds[0].args == {"step": 150, "commit": "c" * 32}  # the COMMIT rank 0's ack named
    plan = d.rec.jobs["j1"]
    assert plan.final_note == "committed at step 150"
    assert (plan.stop_step, plan.stop_step_exact, plan.durable_step) == (150, True, 150)
    assert d.rec.ups_at_stop["A"].runtime_s == 74
    f = figures.job_figures(plan, d.rec)
    assert f["lost_steps"] == 0 and f["steps_since_checkpoint"] == 49 and f["kept_steps"] == 49


def test_a_final_checkpoint_that_cannot_fit_falls_back_to_the_power_checkpoint_and_says_so():
    d = Drive(policy=AT_STOP.model_copy(update={"max_on_battery_s": 100}))
    checkpointed(d, took_s=10.0)
    heartbeat(d, "j1", 180)  # training went on during the hold
    d.power("A", True, runtime_s=75)  # 5 s left before the reserve: no room for a 10 s checkpoint
    assert d.state == "shutting_down"
    plan = d.rec.jobs["j1"]
    assert plan.final is None
    assert plan.final_note.startswith("skipped: the power checkpoint took 10.0s, 5.0s left")
    assert (plan.stop_step, plan.stop_step_exact, plan.durable_step) == (180, False, 101)
    f = figures.job_figures(plan, d.rec)
    assert f["lost_steps"] == 79 and f["lost_steps_at_least"] is True
    assert d.rec.history[-1].reason.endswith("final checkpoint skipped: j1")


def test_a_rank_silent_in_the_final_checkpoint_delays_the_shutdown_by_no_more_than_the_margins_share():
    d = Drive(policy=AT_STOP.model_copy(update={"max_on_battery_s": 30}))
    checkpointed(d, took_s=1.0)
    d.advance(30)  # the hold limit: stop with a final checkpoint (budget: min(120, 300 - 70))
    assert d.state == "final_checkpoint"
    for r in range(3):
        d.ack("j1", r, request_id="s1/j1/final", step=140)
    d.power("A", True, runtime_s=90)  # 20 s left: the deadline shrinks with the battery
    assert d.state == "final_checkpoint" and d.rec.jobs["j1"].final.deadline == d.now + 20
    d.power("A", True, runtime_s=69)  # inside reserve + margin: no budget left, 10 % of the 59 s left
    assert d.state == "final_checkpoint" and d.rec.jobs["j1"].final.deadline == d.now + 0.1 * (69 - 10)
    cmds = d.advance(0.1 * (69 - 10))
    assert d.state == "shutting_down"
    assert ("shutdown", "n1") in d.kinds(cmds)
    plan = d.rec.jobs["j1"]
    assert "ranks 3 did not ack by the deadline" in plan.final_note and plan.durable_step == 101


def test_forced_shutdown_skips_the_final_checkpoint():
    d = Drive(policy=AT_STOP)
    checkpointed(d, took_s=1.0)
    d.power("A", True, runtime_s=250, fsd=True)
    assert d.state == "shutting_down"
    assert d.rec.jobs["j1"].final_note.startswith("skipped: forced shutdown (FSD)")


def test_pause_asks_ranks_to_wait_and_releases_them_when_power_returns():
    d = Drive(policy=PAUSE)
    cmds = d.power("A", True, runtime_s=300)
    assert cmds[0].args["then"] == "pause" and cmds[0].args["pause_max_s"] == PAUSE.pause_max_s
    d.ack_all("j1")
    cmds = d.power("A", False)
    assert d.state == "cancelled"
    assert d.kinds(cmds) == [("release", "j1")] and cmds[0].key == "s1/j1/release"
    assert figures.rpo_steps(d.rec) == 0


def test_pause_then_stop_needs_no_final_checkpoint_and_loses_nothing():
    d = Drive(policy=PAUSE)
    checkpointed(d, took_s=1.0, step=101)
    heartbeat(d, "j1", 101)
    cmds = d.power("A", True, runtime_s=59)
    assert d.state == "shutting_down" and ("ckpt_request", "j1") not in d.kinds(cmds)
    plan = d.rec.jobs["j1"]
    assert (plan.stop_step, plan.stop_step_exact) == (101, True)
    d.power("A", False, charge_pct=100)
    for n in ("n1", "n2"):
        d.node(n, "off")
    d.advance(31)
    for n in ("n1", "n2"):
        d.node(n, "ready")
    d.resumed("j1", step=101)
    assert d.state == "done" and figures.rpo_steps(d.rec) == 0


def test_continue_reports_the_hold_as_lost_work():
    d = Drive()  # harness default: continue
    checkpointed(d, took_s=1.0)
    heartbeat(d, "j1", 260)
    d.advance(20)
    d.power("A", True, runtime_s=59)
    assert d.state == "shutting_down" and d.rec.jobs["j1"].final is None
    f = figures.saga_figures(d.rec)
    assert f["lost_steps"] == 159 and f["hold_s"] == 20.0 and f["runtime_at_stop_s"] == 59
    assert f["jobs"]["j1"]["steps_since_checkpoint"] == 159  # from the power checkpoint at 101


def test_a_job_registration_overrides_the_site_policy():
    d = Drive(policy=AT_STOP)
    for r in range(4):
        d.reg.update(
            AgentData(job="j1", rank=r, world_size=4, node="n1" if r < 2 else "n2", step=100, hold_policy="pause")
        )
    cmds = d.power("A", True, runtime_s=300)
    assert d.rec.jobs["j1"].hold_policy == "pause" and cmds[0].args["then"] == "pause"


def test_a_restarted_coordinator_resends_the_open_final_checkpoint_unchanged():
    d = Drive(policy=AT_STOP.model_copy(update={"max_on_battery_s": 30}))
    checkpointed(d, took_s=1.0)
    cmds = d.advance(30)
    back = record.SagaRecord.model_validate_json(d.rec.model_dump_json())
    again = commands.pending(back, d.policy)
    assert [(c.key, c.args) for c in again] == [(c.key, c.args) for c in cmds]


def test_an_ack_without_a_request_id_or_for_another_request_counts_for_nothing():
    d = Drive(policy=AT_STOP)
    d.power("A", True, runtime_s=300)
    d.ack("j1", 0, request_id=None)
    d.ack("j1", 1, request_id="s1/j1/final")  # not requested yet
    d.ack("j1", 2, request_id="other/j1/ckpt")
    assert d.rec.jobs["j1"].acked == {}


def test_a_hold_checkpoints_every_interval_so_an_fsd_loses_at_most_that_much():
    """checkpoint-at-stop, a 1 s power checkpoint, hold checkpoints every 60 s: two of them in a
    130 s hold, each acked; then FSD leaves no time for the final, and the job stops on the newest
    hold checkpoint, not on the power checkpoint of 130 s ago."""
    d = Drive(policy=AT_STOP.model_copy(update={"hold_checkpoint_every_s": 60}))
    checkpointed(d, took_s=1.0)
    assert d.advance(59.0) == []
    cmds = d.advance(1.0)
    assert d.kinds(cmds) == [("ckpt_request", "j1")]
    hold = cmds[0]
    assert (hold.key, hold.args["reason"], hold.args["then"]) == ("s1/j1/hold.1", "hold", "continue")
    assert hold.args["deadline"] == d.now + min(120, 300 - 60 - 10)
    for r in range(4):
        d.ack("j1", r, request_id="s1/j1/hold.1", step=160)
    assert d.rec.jobs["j1"].hold_step == 160 and d.state == "holding"
    cmds = d.advance(60.0)
    assert [c.key for c in cmds] == ["s1/j1/hold.2"]
    for r in range(4):
        d.ack("j1", r, request_id="s1/j1/hold.2", step=220)
    d.advance(10.0)
    heartbeat(d, "j1", 231)
    d.power("A", True, runtime_s=250, fsd=True)
    assert d.state == "shutting_down"
    plan = d.rec.jobs["j1"]
    assert plan.final_note == "skipped: forced shutdown (FSD); stopped on its hold checkpoint of step 220"
    assert plan.durable_step == 220
    assert figures.job_figures(plan, d.rec)["lost_steps"] == 11  # 10 s of training, not 130


def test_hold_checkpoints_never_take_more_than_their_share_of_the_hold():
    d = Drive(policy=AT_STOP.model_copy(update={"hold_checkpoint_every_s": 10, "hold_checkpoint_max_share": 0.05}))
    checkpointed(d, took_s=4.0)  # 4 s a checkpoint: at most one every 80 s
    assert d.advance(79.0) == [] and d.kinds(d.advance(1.0)) == [("ckpt_request", "j1")]
    d.advance(121.0)  # its ranks never answered: the round ends at its deadline, no step counted
    assert d.rec.jobs["j1"].hold.settled_at is not None and d.rec.jobs["j1"].hold_step is None
