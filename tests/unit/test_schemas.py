"""The event contract: envelope, registry, decoding of bad input, subjects."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from powerguard.schemas import (
    POWER_EVENTS,
    AgentData,
    AgentRegistered,
    CheckpointDurable,
    CheckpointDurableData,
    CheckpointFailed,
    CheckpointFailedData,
    CheckpointRequestData,
    CheckpointRequested,
    DeadLetter,
    DeadLetterData,
    EventError,
    HoldReleased,
    InvalidSubjectToken,
    JobData,
    JobRestarted,
    JobResumed,
    JobStopRequested,
    MalformedEvent,
    NodeState,
    NodeStateData,
    OnBattery,
    PayloadTooLarge,
    PowerActionFailed,
    PowerCommandData,
    PowerData,
    PowerResultData,
    ReleaseData,
    SagaData,
    SagaState,
    SagaStateChanged,
    ShutdownRequested,
    SubjectMismatch,
    Subjects,
    UnknownEventType,
    UnsupportedVersion,
    check_subject,
    decode,
    deterministic_id,
    encode,
    registry,
    utcnow,
)

S = Subjects()
POWER = PowerData(
    site="dc1",
    ups="ups-a",
    on_battery=True,
    status=["OB", "DISCHRG"],
    charge_pct=88.5,
    runtime_s=412.0,
    load_pct=51.0,
    input_v=0.0,
    via="trap",
)


def samples():
    now = utcnow()
    return [
        *[cls(data=POWER) for cls in POWER_EVENTS],
        AgentRegistered(data=AgentData(job="llama", rank=3, world_size=8, node="n1", tiers=["local", "remote"])),
        CheckpointRequested(
            data=CheckpointRequestData(request_id="r1", saga_id="s1", job="llama", deadline=now + timedelta(seconds=60))
        ),
        CheckpointDurable(
            data=CheckpointDurableData(
                job="llama",
                rank=3,
                step=1200,
                path="/nvme/llama/step-1200",
                bytes=123456,
                digest="ab" * 16,
                saga_id="s1",
            )
        ),
        CheckpointFailed(data=CheckpointFailedData(job="llama", rank=2, error="disk full", saga_id="s1")),
        SagaStateChanged(
            data=SagaData(saga_id="s1", site="dc1", state=SagaState.PARTIAL, missing_ranks={"llama": [2]})
        ),
        ShutdownRequested(data=PowerCommandData(saga_id="s1", node="n1", idempotency_key="s1/n1/shutdown")),
        PowerActionFailed(data=PowerResultData(node="n1", action="soft_off", error="BMC timeout")),
        NodeState(data=NodeStateData(node="n1", state="off")),
        JobResumed(data=JobData(job="llama", step=1200)),
        JobStopRequested(data=JobData(job="llama", saga_id="s1", idempotency_key="s1/llama/stop")),
        JobRestarted(data=JobData(job="llama", saga_id="s1")),
        HoldReleased(data=ReleaseData(job="llama", saga_id="s1")),
        DeadLetter(
            data=DeadLetterData.capture(
                service="coordinator", subject="pg.x", payload=b"\xff\x00", error=ValueError("bad")
            )
        ),
    ]


@pytest.mark.parametrize("event", samples(), ids=lambda e: e.short_type)
def test_round_trip_keeps_id_type_and_data(event):
    back = decode(encode(event))
    assert type(back) is type(event)
    assert back == event
    assert back.id == event.id and back.type == event.type and back.data == event.data


def test_every_registered_type_is_versioned_and_has_a_subject():
    reg = registry()
    assert len(reg) >= 27
    for type_, model in reg.items():
        assert type_.startswith("io.powerguard.") and ".v1." in type_
        assert model.SUBJECT_TEMPLATE.startswith("{prefix}.")


def test_subjects_follow_the_design():
    events = {e.short_type: e for e in samples()}
    assert events["power.v1.on_battery"].nats_subject(S) == "pg.power.dc1.ups-a"
    assert events["agent.v1.registered"].nats_subject(S) == "pg.agent.llama.3"
    assert events["ckpt.v1.requested"].nats_subject(S) == "pg.ckpt.llama.request"
    assert events["ckpt.v1.durable"].nats_subject(S) == "pg.ckpt.llama.3.ack"
    assert events["saga.v1.state_changed"].nats_subject(S) == "pg.saga.s1"
    assert events["power.v1.shutdown_requested"].nats_subject(S) == "pg.cmd.power.n1"
    assert events["power.v1.action_failed"].nats_subject(S) == "pg.result.power.n1"
    assert events["job.v1.resumed"].nats_subject(S) == "pg.ckpt.llama.resumed"
    assert events["job.v1.stop_requested"].nats_subject(S) == "pg.cmd.job.llama"
    assert events["job.v1.restarted"].nats_subject(S) == "pg.result.job.llama"
    assert events["dlq.v1.dead_letter"].nats_subject(S) == "pg.dlq.coordinator"
    assert OnBattery.wildcard(Subjects("site7")) == "site7.power.*.*"
    assert CheckpointDurable.wildcard(S) == "pg.ckpt.*.*.ack"


@pytest.mark.parametrize("bad", ["a.b", "with space", "", "*", ">", "x" * 129])
def test_subject_tokens_are_validated(bad):
    with pytest.raises(InvalidSubjectToken):
        S.power("dc1", bad)


def test_every_event_belongs_on_its_own_subject_only():
    events = samples()
    for event in events:
        assert check_subject(event, event.nats_subject(S), S) is event
    shutdown = next(e for e in events if e.short_type == "power.v1.shutdown_requested")
    ack = next(e for e in events if e.short_type == "ckpt.v1.durable")
    with pytest.raises(SubjectMismatch, match=r"does not belong on pg\.ckpt\.llama\.request"):
        check_subject(shutdown, "pg.ckpt.llama.request", S)  # a command type on an agent's subject
    with pytest.raises(SubjectMismatch):
        check_subject(ack, "pg.ckpt.other.3.ack", S)  # job llama's ack on another job's subject
    with pytest.raises(SubjectMismatch):
        check_subject(ack, "pg.ckpt.llama.0.ack", S)  # rank 3's ack on rank 0's subject


def test_rank_must_be_a_number():
    with pytest.raises(InvalidSubjectToken):
        S.agent("job", "one")


@pytest.mark.parametrize(
    ("payload", "error", "match"),
    [
        (b"{not json", MalformedEvent, "not JSON"),
        (b"[1, 2]", MalformedEvent, "JSON list"),
        (b'{"id": "x"}', MalformedEvent, "no string 'type'"),
        (b'{"type": "com.example.other", "data": {}}', UnknownEventType, "unknown event type"),
        (b'{"type": "io.powerguard.power.v2.on_battery", "data": {}}', UnsupportedVersion, "v1.on_battery"),
        (b"\xff\xfe", MalformedEvent, "not JSON"),
    ],
)
def test_bad_input_raises_a_precise_error(payload, error, match):
    with pytest.raises(error, match=match):
        decode(payload)


def test_invalid_data_names_the_field():
    raw = json.loads(encode(OnBattery(data=POWER)))
    raw["data"]["charge_pct"] = 150
    with pytest.raises(MalformedEvent, match=r"data\.charge_pct"):
        decode(json.dumps(raw))
    raw["data"]["charge_pct"] = 50
    raw["specversion"] = "0.3"
    with pytest.raises(MalformedEvent, match="specversion"):
        decode(json.dumps(raw))


def test_oversize_payload_is_refused_before_parsing():
    with pytest.raises(PayloadTooLarge):
        decode(b" " * 2048, max_bytes=1024)


def test_type_cannot_be_changed_on_a_model():
    with pytest.raises(ValidationError):
        OnBattery(type="io.powerguard.power.v1.on_line", data=POWER)


def test_unknown_data_fields_are_ignored_for_forward_compatibility():
    raw = json.loads(encode(OnBattery(data=POWER)))
    raw["data"]["added_in_v1_1"] = True
    assert decode(json.dumps(raw)).data == POWER


def test_deterministic_ids_are_stable_and_distinct():
    a = deterministic_id("dc1", "ups-a", "on_battery", 7)
    assert a == deterministic_id("dc1", "ups-a", "on_battery", 7)
    assert a != deterministic_id("dc1", "ups-a", "on_battery", 8)


def test_dead_letter_keeps_a_bounded_copy():
    big = DeadLetterData.capture(service="s", subject="pg.x", payload=b"a" * 10000, error="e", limit=100)
    assert big.truncated and big.payload_size == 10000 and len(big.payload) == 100
    binary = DeadLetterData.capture(service="s", subject="pg.x", payload=b"\xff\xfe", error="e")
    assert binary.payload_encoding == "base64" and not binary.truncated


FIELD_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["io.powerguard.ckpt.v1.durable", "io.powerguard.ckpt.v1.failed", "2026-12-05T00:00:00Z"]),
    st.lists(st.integers(), max_size=3),
)


CHANGED = ["type", "time", "id", "rank", "step", "job", "x"]


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(samples()),
    st.lists(
        st.tuples(st.booleans(), st.sampled_from(["type", "time", "id", "rank", "step", "job", "x"]), FIELD_VALUES)
    ),
)
def test_decoding_accepts_exactly_what_the_model_accepts_of_the_parsed_json(event, changes):
    """The decoder's fast path (pydantic's JSON parser, the model guessed from the payload's
    ``type``) never accepts what the model refuses of the parsed payload, and reads the same."""
    obj = json.loads(encode(event))
    for in_data, name, value in changes:  # a "type" in the data, a type of another event, junk
        (obj["data"] if in_data else obj)[name] = value
    raw = json.dumps(obj).encode()
    try:
        want = registry()[json.loads(raw)["type"]].model_validate(json.loads(raw))
    except (KeyError, TypeError, ValidationError):
        want = None
    try:
        got = decode(raw)
    except EventError:
        got = None
    assert repr(got) == repr(want)  # (a NaN the model keeps, in a field it ignores, is never equal to itself)


DURABLE = CheckpointDurable(
    data=CheckpointDurableData(job="j", rank=0, step=1, path="/c", bytes=1, digest="ab" * 16, saga_id="s1")
)


@pytest.mark.parametrize("top", [5, None, "io.powerguard.ckpt.v1.failed", "io.powerguard.nope.v1.x"])
def test_a_type_in_the_data_is_never_taken_for_the_events_type(top):
    """The fast path guesses the model from the first ``"type"`` in the payload: put the data's
    first (the envelope's last), it names another type than the envelope's; the envelope's wins."""
    obj = json.loads(encode(DURABLE))
    obj["data"]["type"] = DURABLE.type
    del obj["type"]
    obj["type"] = top  # after the data: the first "type" in the text is the data's
    with pytest.raises(EventError):
        decode(json.dumps(obj).encode())


def test_rank_0s_ack_for_the_job_names_its_ranks_as_spans_and_nobody_else_may():
    base = dict(request_id="r1", job="llama", world_size=16, step=3, path="/x", bytes=1, digest="00")
    ack = CheckpointDurableData(rank=0, ranks=[(0, 7), (9, 15)], **base)
    assert ack.speaks_for() == [*range(8), *range(9, 16)] and ack.who() == "ranks 0-7, 9-15"
    assert decode(encode(CheckpointDurable(data=ack))).data.speaks_for() == ack.speaks_for()
    assert CheckpointDurableData(rank=5, **base).speaks_for() == [5]
    for bad, why in [
        (dict(rank=3, ranks=[(0, 15)]), "only rank 0"),
        (dict(rank=0, ranks=[(1, 15)]), "sender"),
        (dict(rank=0, ranks=[(0, 7), (7, 15)]), "ascending, disjoint"),
        (dict(rank=0, ranks=[(0, 16)]), "within the world"),
        (dict(rank=0, ranks=[(0, 3), (2, 1)]), "ascending"),
        (dict(rank=0, ranks=[]), "sender"),
    ]:
        with pytest.raises(ValidationError, match=why):
            CheckpointDurableData(**bad, **base)
    with pytest.raises(ValidationError, match="at most 512"):
        CheckpointDurableData(rank=0, ranks=[(2 * i, 2 * i) for i in range(513)], **{**base, "world_size": None})
    # a request asks for one ack per job only when its requester takes it: an agent's default is per rank
    assert CheckpointRequestData(request_id="r", job="j", deadline=utcnow()).acks == "rank"
