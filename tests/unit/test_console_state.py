"""The console's pure state: events, agent records and polled saga summaries -> the snapshot the
page renders (injected clock). A phase shorter than the saga poll still shows; a newer record
wins over an older event; the countdown is the request's deadline."""

from __future__ import annotations

from datetime import UTC, datetime

from powerguard.console.state import ConsoleState, timeline_svg
from powerguard.schemas import (
    AgentData,
    CheckpointDurable,
    CheckpointDurableData,
    OnBattery,
    PowerData,
    SagaData,
    SagaStateChanged,
)

T0 = 1_800_000_000.0


def at(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


def saga_event(state: str, t: float, deadline: float | None = None) -> SagaStateChanged:
    return SagaStateChanged(
        time=at(t),
        data=SagaData(
            saga_id="s1",
            site="dc1",
            ups=["ups-a"],
            state=state,
            nodes=["n1"],
            deadline=at(deadline) if deadline else None,
        ),
    )


def test_events_show_the_saga_before_its_record_is_polled_and_count_down_to_the_deadline():
    now = [T0]
    st = ConsoleState(clock=lambda: now[0], reserve_s=60, budget_s=120)
    st.apply(OnBattery(data=PowerData(site="dc1", ups="ups-a", on_battery=True, runtime_s=900, observed_at=at(T0))))
    st.apply(saga_event("checkpointing", T0 + 0.2, deadline=T0 + 30))
    snap = st.snapshot()
    assert snap["ups"][0]["on_battery"] is True and snap["ups"][0]["runtime_s"] == 900
    assert snap["saga"]["state"] == "checkpointing" and snap["saga"]["deadline_ts"] == T0 + 30
    assert snap["saga"]["acks"] == "0/?"
    st.set_agent("j.0", AgentData(job="j", rank=0, world_size=2, node="n1"))
    st.apply(
        CheckpointDurable(
            time=at(T0 + 1),
            data=CheckpointDurableData(
                request_id="r",
                saga_id="s1",
                job="j",
                rank=0,
                world_size=2,
                step=7,
                tier="local",
                path="/c",
                bytes=1,
                digest="d",
            ),
        )
    )
    st.set_sagas(
        [
            {
                "saga": "s1",
                "state": "checkpointing",
                "acks": "0/2",
                "budget_left_s": 29.0,
                "started": T0,
                "state_at": T0 + 0.2,
            }
        ]
    )
    snap = st.snapshot()
    assert snap["saga"]["acks"] == "1/2"  # the ack event is newer than the poll
    assert snap["jobs"][0]["last_checkpoint"]["step"] == 7 and snap["jobs"][0]["ranks"] == 1
    st.apply(saga_event("holding", T0 + 2))
    assert st.snapshot()["saga"]["state"] == "holding" and st.snapshot()["saga"]["deadline_ts"] is None


def test_a_newer_record_wins_over_an_older_event_and_a_closed_saga_goes_to_the_past():
    st = ConsoleState(clock=lambda: T0 + 100)
    st.apply(saga_event("checkpointing", T0 + 1, deadline=T0 + 30))  # then events were missed (a reconnect)
    st.set_sagas([{"saga": "s1", "state": "down", "acks": "2/2", "started": T0, "state_at": T0 + 50}])
    assert st.snapshot()["saga"]["state"] == "down"
    st.set_sagas([{"saga": "s1", "state": "done", "acks": "2/2", "started": T0, "state_at": T0 + 90}])
    snap = st.snapshot()
    assert snap["saga"] is None and snap["past"][0]["state"] == "done"


def test_the_timeline_picture_escapes_what_the_record_says():
    svg = timeline_svg(
        {"saga": "s<1>"}, [{"state": "detected", "at": T0, "reason": "<script>"}, {"state": "done", "at": T0 + 5}]
    )
    assert "<script>" not in svg and "&lt;script&gt;" in svg and svg.startswith("<svg")


def test_status_telemetry_updates_the_ups_but_not_the_timeline():
    from powerguard.schemas import PowerStatus

    st = ConsoleState(clock=lambda: T0)
    st.apply(OnBattery(data=PowerData(site="dc1", ups="ups-a", on_battery=True, runtime_s=900, observed_at=at(T0))))
    for i in range(20):  # one every few seconds during a long hold
        st.apply(
            PowerStatus(
                data=PowerData(site="dc1", ups="ups-a", on_battery=True, runtime_s=890 - i, observed_at=at(T0 + i))
            )
        )
    snap = st.snapshot()
    assert snap["ups"][0]["runtime_s"] == 871
    assert [t["type"] for t in snap["timeline"]] == ["power.v1.on_battery"]


def test_a_drills_readings_are_marked_beside_the_ups_own_and_never_replace_it():
    """A drill's synthetic ON BATTERY (the operator's `powerguard drill`) was shown as the UPS's
    own state, its runtime in the real row and its timeline line unmarked: an SRE glancing at the
    console saw a real outage. It is now kept apart (``drill``) and its lines say [drill]."""
    from powerguard.schemas import OnLine, PowerStatus

    st = ConsoleState(clock=lambda: T0)
    real = PowerData(site="dc1", ups="ups-a", on_battery=False, runtime_s=1800, charge_pct=100, observed_at=at(T0))
    st.apply(OnLine(data=real))
    drill = dict(site="dc1", ups="ups-a", on_battery=True, runtime_s=200, charge_pct=90, drill=True)
    st.apply(OnBattery(data=PowerData(**drill, observed_at=at(T0 + 1))))
    st.apply(PowerStatus(data=PowerData(**{**drill, "runtime_s": 180}, observed_at=at(T0 + 2))))
    ups = st.snapshot()["ups"][0]
    assert (ups["on_battery"], ups["runtime_s"], ups["charge_pct"]) == (False, 1800, 100)  # the UPS's own word
    assert ups["drill"] == {"on_battery": True, "charge_pct": 90, "runtime_s": 180, "load_pct": None}
    lines = st.snapshot()["timeline"]
    assert [(t["type"], t["drill"]) for t in lines] == [("power.v1.on_line", False), ("power.v1.on_battery", True)]
    st.apply(OnLine(data=PowerData(**{**drill, "on_battery": False}, observed_at=at(T0 + 3))))
    assert "drill" not in st.snapshot()["ups"][0]  # the drill's mains back: the row is the UPS's alone
