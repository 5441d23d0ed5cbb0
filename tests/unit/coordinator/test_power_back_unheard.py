"""Power returns before any shutdown, but the site had gone dark (a blackout, a runtime estimate
that was wrong): the ranks died with their nodes' power, and nothing restarts them unless the
saga does. A saga ends ``cancelled`` only once every job it protects has been heard from since
power returned; a job silent for ``job_silence_s`` is restarted from its newest durable checkpoint.
(Before this rule every such saga ended ``cancelled`` at once and the job stayed dead.)"""

from __future__ import annotations

import math

from powerguard.coordinator.topology import AgentRegistry
from powerguard.schemas import AgentData

from .harness import POLICY, Drive

SILENCE = POLICY.job_silence_s


def stored_registry() -> AgentRegistry:
    """What a coordinator that just started knows: the bucket's stored records, nothing heard."""
    reg = AgentRegistry()
    for rank, node in enumerate(["n1", "n1", "n2", "n2"]):
        reg.update(AgentData(job="j1", rank=rank, world_size=4, node=node, step=100), 1000.0, heard=False)
    reg.update(AgentData(job="j2", rank=0, world_size=1, node="n2", step=50), 1000.0, heard=False)
    return reg


def heard(d: Drive, job: str, world: int, node: str) -> None:
    for rank in range(world):
        d.reg.update(AgentData(job=job, rank=rank, world_size=world, node=node, step=120), d.now)


def holding(d: Drive) -> None:
    d.power("A", True)
    heard(d, "j1", 4, "n1")  # the ranks were alive during the outage: they acked
    heard(d, "j2", 1, "n2")
    d.ack_all("j1")
    d.ack_all("j2")
    assert d.state == "holding"


def test_jobs_silent_since_power_returned_are_restarted_from_their_checkpoint():
    d = Drive(reg=stored_registry())
    holding(d)
    d.advance(5)
    d.reg = stored_registry()  # the site went dark: a new coordinator knows only the stored records
    d.power("A", False)
    assert d.state == "holding"  # not cancelled: no rank has been heard since
    assert d.kinds(d.advance(SILENCE - 1)) == [] and d.state == "holding"
    cmds = d.advance(1)
    assert d.state == "restoring" and "not heard from" in d.rec.reason, d.rec.reason
    assert sorted(d.kinds(cmds)) == [("job_restart", "j1"), ("job_restart", "j2")]
    assert not any(k == "power_on" for k, _ in d.kinds(d.commands))  # no node was shut down: none powered on
    d.resumed("j1", 101)
    d.resumed("j2", 101)
    assert d.state == "done"


def test_jobs_heard_since_power_returned_keep_running_and_the_saga_is_cancelled():
    d = Drive(reg=stored_registry())
    holding(d)
    d.advance(5)
    d.power("A", False)
    d.advance(2)
    heard(d, "j1", 4, "n1")
    assert d.state == "holding"  # j2 not heard yet
    heard(d, "j2", 1, "n2")
    cmds = d.advance(1)
    assert d.state == "cancelled" and d.rec.reason == "power back before shutdown"
    assert not any(k == "job_restart" for k, _ in d.kinds(cmds + d.commands))


def test_only_the_silent_job_is_restarted():
    d = Drive(reg=stored_registry())
    holding(d)
    d.advance(5)
    d.power("A", False)
    d.advance(1)
    heard(d, "j1", 4, "n1")
    cmds = d.advance(SILENCE)
    assert d.state == "restoring" and "j2" in d.rec.reason and "j1" not in d.rec.reason
    assert d.kinds(cmds) == [("job_restart", "j2")]
    assert d.rec.jobs["j1"].kept_running and not d.rec.jobs["j2"].kept_running
    d.resumed("j2", 101)
    assert d.state == "done"


def test_a_job_that_ended_is_not_waited_for():
    d = Drive(reg=stored_registry())
    holding(d)
    d.reg.remove("j2", 0)  # j2's rank deregistered: it finished
    d.power("A", False)
    heard(d, "j1", 4, "n1")
    d.advance(1)
    assert d.state == "cancelled"


def test_power_failing_again_while_waiting_keeps_the_saga_protecting():
    d = Drive(reg=stored_registry())
    holding(d)
    d.advance(5)
    d.power("A", False)
    d.advance(SILENCE / 2)
    d.power("A", True)  # before the silence ran out: still an outage, the saga holds
    assert d.state == "holding" and d.rec.back_before_shutdown_at is None
    cmds = d.advance(SILENCE)
    assert not any(k == "job_restart" for k, _ in d.kinds(cmds))
    assert d.state in ("holding", "final_checkpoint", "shutting_down")


def test_the_registry_tells_stored_records_from_ranks_heard():
    reg = stored_registry()
    assert reg.jobs(1000.0)["j1"].heard_at == -math.inf
    reg.update(AgentData(job="j1", rank=2, world_size=4, node="n2", step=130), 1010.0)
    assert reg.jobs(1010.0)["j1"].heard_at == 1010.0
    assert reg.jobs(1010.0)["j2"].heard_at == -math.inf
    for rank in range(4):
        reg.remove("j1", rank)
    reg.update(AgentData(job="j1", rank=0, world_size=4, node="n1", step=0), 1020.0, heard=False)
    assert reg.jobs(1020.0)["j1"].heard_at == -math.inf  # a job gone and back: not heard from its old ranks


def test_a_job_the_registry_lost_with_the_power_is_restarted_not_taken_for_ended():
    """The registry lives in the servers' memory: a cut of every server empties it, and a
    coordinator started after it knows no record of the jobs whose ranks died. Absent is not
    ended (only a job whose ranks deregistered is): the job is restarted. (Before, an absent job
    counted as ended and the saga was cancelled with the job dead: chaos seed 4.)"""
    d = Drive(reg=stored_registry())
    holding(d)
    d.advance(5)
    d.reg = AgentRegistry()  # the site went dark with every server: nothing stored survives
    d.power("A", False)
    assert d.state == "holding"
    cmds = d.advance(SILENCE)
    assert d.state == "restoring" and "not heard from" in d.rec.reason, d.rec.reason
    assert sorted(d.kinds(cmds)) == [("job_restart", "j1"), ("job_restart", "j2")]
