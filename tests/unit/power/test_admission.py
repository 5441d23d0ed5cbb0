"""power-control's admission rule: a pure function of the command, the saga's announced state
and the clock."""

from __future__ import annotations

from datetime import timedelta

import pytest

from powerguard.power_control.admission import NO_SAGA, may_be_stale, refusal
from powerguard.schemas import (
    JobData,
    JobRestartRequested,
    JobStopRequested,
    PowerCommandData,
    PowerOnRequested,
    SagaState,
    ShutdownRequested,
    UpsOutputCommandData,
    UpsOutputOffRequested,
    utcnow,
)

NOW = utcnow()


def shutdown(node: str = "n1", age_s: float = 0.0) -> ShutdownRequested:
    data = PowerCommandData(saga_id="s1", node=node, idempotency_key=f"s1/{node}/shutdown")
    return ShutdownRequested(time=NOW - timedelta(seconds=age_s), data=data)


def job_stop(job: str = "train") -> JobStopRequested:
    return JobStopRequested(
        time=NOW, data=JobData(job=job, saga_id="s1", nodes=["n1"], idempotency_key=f"s1/{job}/stop")
    )


def job_restart(job: str = "train") -> JobRestartRequested:
    data = JobData(job=job, saga_id="s1", nodes=["n1"], idempotency_key=f"s1/{job}/restart")
    return JobRestartRequested(time=NOW, data=data)


def ups_off(ups: str = "ups-a") -> UpsOutputOffRequested:
    data = UpsOutputCommandData(saga_id="s1", ups=ups, idempotency_key=f"s1/ups:{ups}/output_off", delay_s=30)
    return UpsOutputOffRequested(time=NOW, data=data)


def why(event, saga=SagaState.SHUTTING_DOWN) -> str | None:
    return refusal(event, now=NOW.timestamp(), max_age_s=300, nodes={"n1"}, ups={"ups-a"}, saga=saga)


def test_a_current_command_of_an_announced_saga_runs():
    assert why(shutdown()) is None
    assert why(ups_off(), SagaState.PARTLY_DOWN) is None
    on = PowerOnRequested(time=NOW, data=PowerCommandData(saga_id="s1", node="n1", idempotency_key="s1/n1/on"))
    assert why(on, SagaState.RESTORING) is None


def test_an_old_command_is_refused_with_its_age():
    assert why(shutdown(age_s=301)) == "command is 301s old (max_command_age_s 300)"


def test_a_node_or_ups_outside_the_site_file_is_refused():
    assert "node 'n9' is not in the site file" in why(shutdown("n9"))
    assert "UPS 'ups-z' is not in the site file" in why(ups_off("ups-z"), SagaState.DOWN)


def test_a_saga_never_announced_is_refused_and_no_saga_needed_when_the_site_says_so():
    assert why(shutdown(), NO_SAGA) == "saga 's1' was never announced by the coordinator"
    assert why(shutdown(), None) is None


@pytest.mark.parametrize("state", [s for s in SagaState if s.after_shutdown])
def test_a_shutdown_after_its_sagas_shutdown_is_refused(state):
    assert why(shutdown(), state) == f"saga s1 is {state}: a shutdown of n1 is over"


@pytest.mark.parametrize("state", list(SagaState))
def test_a_job_stop_runs_until_its_sagas_shutdown_is_over(state):
    """A stop delivered again after the ack wait (the power-control that took it first died)
    must not kill the job the saga has restarted since."""
    expected = f"saga s1 is {state}: its stop of job train is over (the job may be running again)"
    assert why(job_stop(), state) == (expected if state.after_shutdown else None)


@pytest.mark.parametrize("state", list(SagaState))
def test_a_job_restart_is_refused_once_its_saga_resumed_its_jobs_or_ended_without_a_restore(state):
    late = state in (SagaState.RESUMED, SagaState.DONE, SagaState.CANCELLED)
    expected = f"saga s1 is {state}: it restarts no job any more (a late restart of train)"
    assert why(job_restart(), state) == (expected if late else None)


@pytest.mark.parametrize("state", list(SagaState))
def test_a_ups_output_is_cut_only_while_its_saga_is_down(state):
    assert (why(ups_off(), state) is None) == (state in (SagaState.DOWN, SagaState.PARTLY_DOWN))


ORDER = list(SagaState)  # the declaration order is the order a saga moves through


@pytest.mark.parametrize(
    "event", [shutdown(), job_stop(), job_restart(), ups_off()], ids=["shutdown", "job_stop", "job_restart", "ups_off"]
)
@pytest.mark.parametrize("shown", list(SagaState))
def test_a_refusal_is_read_again_only_when_a_newer_state_could_admit_the_command(event, shown):
    """A lagging replica shows an older state: read again exactly when some later state
    (one a saga can move on to) would admit what the shown one refused."""
    if why(event, shown) is None:
        return
    later = [s for s in ORDER[ORDER.index(shown) + 1 :] if not s.terminal] if not shown.terminal else []
    assert may_be_stale(event, shown) == any(why(event, s) is None for s in later)


def test_never_announced_is_always_read_again():
    assert may_be_stale(shutdown(), NO_SAGA) and may_be_stale(ups_off(), NO_SAGA)
