"""The typed bus against a real nats-server (session fixture, isolated names per test)."""

from __future__ import annotations

import asyncio

import pytest
from opentelemetry.trace import SpanKind

from powerguard.bus import Bus, BusNames, CasConflict, ConnectError, EmbeddedNats, ReadError
from powerguard.schemas import (
    DeadLetter,
    Envelope,
    JobData,
    JobResumed,
    OnBattery,
    OnLine,
    PowerData,
    deterministic_id,
)
from tests.waiting import eventually

pytestmark = pytest.mark.integration
TIMEOUT = 10


def power(on_battery: bool = True, ups: str = "ups-a", **kw) -> PowerData:
    return PowerData(site="dc1", ups=ups, on_battery=on_battery, runtime_s=300.0, charge_pct=90.0, **kw)


async def collect(bus: Bus, *types, durable: str = "t", **kw) -> asyncio.Queue[Envelope]:
    queue: asyncio.Queue[Envelope] = asyncio.Queue()

    async def handler(event: Envelope) -> None:
        await queue.put(event)

    await bus.consume(*types, handler=handler, durable=durable, **kw)
    return queue


async def test_event_round_trips_with_same_id_type_and_data(bus):
    queue = await collect(bus, OnBattery)
    sent = OnBattery(source="/powerguard/test", data=power())
    ack = await bus.publish(sent)
    got = await asyncio.wait_for(queue.get(), TIMEOUT)
    assert ack.stream == bus.names.stream and not ack.duplicate
    assert (got.id, got.type, got.data, got.source) == (sent.id, sent.type, sent.data, sent.source)


async def test_same_event_published_twice_is_stored_once(make_bus):
    a, b = await make_bus("monitor-a"), await make_bus("monitor-b")
    queue = await collect(a, OnBattery, OnLine)
    event = OnBattery(id=deterministic_id("dc1", "ups-a", "on_battery", 1), data=power())
    first = await a.publish(event)
    second = await b.publish(event)  # a second monitor sees the same transition
    assert not first.duplicate and second.duplicate and second.seq == first.seq
    await a.publish(OnLine(data=power(on_battery=False)))  # sentinel: everything before it is delivered
    got = [await asyncio.wait_for(queue.get(), TIMEOUT) for _ in range(2)]
    assert [type(e) for e in got] == [OnBattery, OnLine]
    info = await a.js.stream_info(a.names.stream)
    assert info.state.messages == 2


async def test_malformed_payload_goes_to_dlq_and_processing_continues(bus):
    dlq = bus.subscribe(DeadLetter, deliver="all")
    await dlq.start()
    queue = await collect(bus, OnBattery)
    subject = bus.subjects.power("dc1", "ups-a")
    await bus.nc.publish(subject, b'{"type": "io.powerguard.power.v1.on_battery", "data": {"site": 1}}')
    await bus.nc.publish(subject, b"\x00 definitely not json")
    good = OnBattery(data=power())
    await bus.publish(good)
    assert (await asyncio.wait_for(queue.get(), TIMEOUT)).id == good.id
    letters = [await asyncio.wait_for(dlq.__anext__(), TIMEOUT) for _ in range(2)]
    await dlq.aclose()
    assert {d.data.error_type for d in letters} == {"MalformedEvent"}
    assert all(d.data.service == "test" and d.data.subject == subject for d in letters)
    assert letters[1].data.payload.endswith("definitely not json")
    assert queue.empty()


async def test_handler_failure_is_redelivered_then_acked(bus):
    attempts: list[int] = []
    done = asyncio.Event()

    async def flaky(event: Envelope) -> None:
        attempts.append(1)
        if len(attempts) < 3:
            raise RuntimeError("transient")
        done.set()

    consumer = await bus.consume(OnBattery, handler=flaky, durable="flaky", backoff=(0.05,))
    await bus.publish(OnBattery(data=power()))
    await asyncio.wait_for(done.wait(), TIMEOUT)
    assert len(attempts) == 3
    await consumer.stop()
    # the ack is a publish the server confirms to no one: wait for its consumer to count it

    async def acked():
        info = await bus.js.consumer_info(bus.names.stream, "flaky")
        return None if info.num_ack_pending else info

    info = await eventually(acked, TIMEOUT, "the server to count the last ack", every=0.05)
    assert info.num_ack_pending == 0 and info.num_pending == 0, info


async def test_handler_that_always_fails_ends_in_dlq_after_bounded_deliveries(bus):
    attempts: list[int] = []

    async def broken(event: Envelope) -> None:
        attempts.append(1)
        raise ValueError("cannot handle this")

    dlq = bus.subscribe(DeadLetter, deliver="all")
    await dlq.start()
    await bus.consume(OnBattery, handler=broken, durable="broken", max_deliver=3, backoff=(0.02,))
    await bus.publish(OnBattery(data=power()))
    letter = await asyncio.wait_for(dlq.__anext__(), TIMEOUT)
    await dlq.aclose()
    assert letter.data.deliveries == 3 and "cannot handle this" in letter.data.error
    assert len(attempts) == 3


async def test_consumer_span_is_in_the_producer_trace(bus, spans):
    queue = await collect(bus, OnBattery)
    await bus.publish(OnBattery(data=power()))
    await asyncio.wait_for(queue.get(), TIMEOUT)
    finished = spans.get_finished_spans()
    producer = next(s for s in finished if s.name == f"publish {bus.names.prefix}.power.{{site}}.{{ups}}")
    # the consumer span ends right after the handler returns
    consumer = (
        await eventually(
            lambda: [s for s in spans.get_finished_spans() if s.name.startswith("process ")], 5, "the consumer span"
        )
    )[0]
    assert producer.kind == SpanKind.PRODUCER and consumer.kind == SpanKind.CONSUMER
    assert consumer.context.trace_id == producer.context.trace_id
    assert consumer.parent.span_id == producer.context.span_id
    assert consumer.attributes["messaging.system"] == "nats"
    assert producer.attributes["messaging.destination.name"] == bus.subjects.power("dc1", "ups-a")


async def test_kv_cas_refuses_a_stale_revision(bus):
    sagas = await bus.sagas()
    rev1 = await sagas.create("saga-1", {"state": "detected"})
    rev2 = await sagas.update("saga-1", {"state": "checkpointing"}, revision=rev1)
    with pytest.raises(CasConflict, match="stale"):
        await sagas.update("saga-1", {"state": "cancelled"}, revision=rev1)
    with pytest.raises(CasConflict):
        await sagas.create("saga-1", {"state": "detected"})
    entry = await sagas.get("saga-1")
    assert entry.revision == rev2 and entry.json() == {"state": "checkpointing"}


async def test_kv_keys_are_listed_even_when_nats_py_answers_no_keys(bus, monkeypatch):
    """nats-py's key listing can say "no keys" while the bucket holds some (its watcher checks
    the pending count after the server already pushed them): a coordinator taking over then
    resumed no saga. The wrapper checks such an answer against the stream itself."""
    from nats.js import errors as js_errors

    sagas = await bus.sagas()
    assert await sagas.keys() == []
    await sagas.create("saga-1", {"state": "holding"})
    await sagas.create("saga-2", {"state": "down"})
    await sagas.create("gone", {"state": "done"})
    await sagas.delete("gone")
    assert await sagas.keys() == ["saga-1", "saga-2"]

    async def no_keys(*args, **kwargs):
        raise js_errors.NoKeysError

    monkeypatch.setattr(sagas.raw, "keys", no_keys)  # the race, every time
    assert await sagas.keys() == ["saga-1", "saga-2"]  # was [] (the open sagas unseen)


async def test_setup_is_idempotent_and_safe_to_race(make_bus, names):
    buses = await asyncio.gather(*(make_bus(f"svc{i}", setup=False) for i in range(3)))
    await asyncio.gather(*(b.setup() for b in buses))
    await buses[0].setup()
    info = await buses[0].js.stream_info(names.stream)
    assert info.config.subjects == names.subjects.event_trees and info.config.duplicate_window == 120
    jobs = (await buses[0].js.stream_info(names.jobs_stream)).config
    assert jobs.subjects == names.subjects.job_trees and jobs.max_msgs_per_subject == 10_000
    assert jobs.discard == "new" and jobs.discard_new_per_subject is True and jobs.max_msg_size == 16 * 1024
    assert (await buses[1].agents()).bucket == names.agents


async def test_subscribe_iterates_typed_events(bus):
    async with bus.subscribe(JobResumed) as sub:
        await sub.start()
        await bus.publish(OnBattery(data=power()))  # other type on another subject: not seen
        await bus.publish(JobResumed(data=JobData(job="llama", step=40)))
        event = await asyncio.wait_for(sub.__anext__(), TIMEOUT)
    assert isinstance(event, JobResumed) and event.data.step == 40


async def test_connect_to_nothing_fails_clearly():
    with pytest.raises(ConnectError, match=r"cannot connect to NATS at nats://127\.0\.0\.1:1 "):
        await Bus.connect("nats://127.0.0.1:1", service="x", connect_timeout=1.0)


async def test_a_connect_whose_setup_fails_leaves_no_connection_behind(tmp_path):
    """A service retrying Bus.connect while JetStream is not ready (a cluster electing its meta
    leader) must not pile up clients that reconnect forever: the failed attempt closes its own."""
    import json
    import urllib.request

    from powerguard.bus import BusError, find_nats_server, free_ports

    port, monitor = free_ports(2)
    server = await asyncio.create_subprocess_exec(  # no JetStream: the stream cannot be set up
        find_nats_server(),
        *("-a", "127.0.0.1", "-p", str(port), "-m", str(monitor)),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:

        def connz(state: str = "open") -> dict:
            with urllib.request.urlopen(f"http://127.0.0.1:{monitor}/connz?state={state}", timeout=2) as r:
                return json.loads(r.read())

        def listening() -> bool:
            try:
                return connz() is not None
            except OSError:
                return False

        await eventually(listening, 10, "the server's monitoring port")
        for _ in range(3):
            with pytest.raises(BusError):
                await Bus.connect(f"nats://127.0.0.1:{port}", service="x", connect_timeout=5.0)
        # the event that shows each attempt ended at the server: its connection listed as closed
        await eventually(lambda: connz("closed")["total"] >= 3, 10, "the server to close the three attempts")
        assert connz()["num_connections"] == 0
    finally:
        server.terminate()
        await server.wait()


async def test_subscriber_survives_a_server_restart(tmp_path):
    server = EmbeddedNats(store_dir=tmp_path).start()
    names = BusNames.isolated()
    try:
        sub_bus = await Bus.connect(server.url, service="sub", names=names)
        pub_bus = await Bus.connect(server.url, service="pub", names=names, setup=False)
        queue = await collect(sub_bus, OnBattery, durable="survivor")
        await pub_bus.publish(OnBattery(data=power(ups="before")))
        assert (await asyncio.wait_for(queue.get(), TIMEOUT)).data.ups == "before"
        port = server.port
        server.stop()
        server.start()  # same port, same store dir
        assert server.port == port
        await pub_bus.publish(OnBattery(data=power(ups="after")), timeout=20)
        assert (await asyncio.wait_for(queue.get(), 20)).data.ups == "after"
        await sub_bus.close()
        await pub_bus.close()
    finally:
        server.cleanup()


async def test_batch_consumer_gets_events_with_headers_and_retries_a_failed_batch(bus):
    batches: list[list] = []
    done = asyncio.Event()

    async def handle(items) -> None:
        batches.append(items)
        if len(batches) == 1:
            raise RuntimeError("store unavailable")
        if sum(len(b) for b in batches[1:]) >= 3:
            done.set()

    for i in range(3):
        await bus.publish(OnBattery(data=power(ups=f"u{i}")))
    await bus.consume_batches(OnBattery, batch_handler=handle, durable="batch", backoff=(0.05,))
    await asyncio.wait_for(done.wait(), TIMEOUT)
    assert len(batches[0]) == 3  # everything pending arrived as one batch
    again = [item for b in batches[1:] for item in b]
    assert sorted(i.event.data.ups for i in again) == ["u0", "u1", "u2"]  # redelivered after the failure
    assert all(len(i.trace_id or "") == 32 and i.subject.startswith(bus.names.prefix) for i in again)


async def test_subscription_recreates_a_consumer_deleted_under_it(make_bus):
    """The server deletes an ephemeral consumer when its host dies, when it idles past its
    inactive threshold, or when an operator removes it; pulls then answer "no messages" for
    ever. The reader must notice and go on after the last message it saw, missing nothing."""
    pub, obs = await make_bus("ups-monitor"), await make_bus("observer")
    events = [OnBattery(data=power().model_copy(update={"runtime_s": 300.0 - i})) for i in range(4)]
    sub = await obs.subscribe(OnBattery, deliver="all").start()
    await pub.publish(events[0])
    await pub.publish(events[1])
    got = [(await asyncio.wait_for(sub.__anext__(), TIMEOUT)).id for _ in range(2)]
    await pub.js.delete_consumer(pub.names.stream, sub.name)
    await pub.publish(events[2])
    await pub.publish(events[3])
    got += [(await asyncio.wait_for(sub.__anext__(), 30)).id for _ in range(2)]
    await sub.aclose()
    assert got == [e.id for e in events]


async def test_subscription_rebinds_a_consumer_that_holds_messages_back(make_bus):
    """A consumer that exists but delivers nothing while messages wait (here: paused by an
    operator; in a cluster: stuck after its server's stream replica changed) must not stall
    the reader: two idle checks that see undelivered messages re-create it."""
    import json
    from datetime import UTC, datetime, timedelta

    pub, obs = await make_bus("ups-monitor"), await make_bus("observer")
    events = [OnBattery(data=power().model_copy(update={"runtime_s": 300.0 - i})) for i in range(3)]
    sub = await obs.subscribe(OnBattery, deliver="all").start()
    await pub.publish(events[0])
    got = [(await asyncio.wait_for(sub.__anext__(), TIMEOUT)).id]
    until = (datetime.now(UTC) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    reply = await pub.nc.request(
        f"$JS.API.CONSUMER.PAUSE.{pub.names.stream}.{sub.name}", json.dumps({"pause_until": until}).encode(), timeout=5
    )
    assert json.loads(reply.data).get("paused"), reply.data
    await pub.publish(events[1])
    await pub.publish(events[2])
    got += [(await asyncio.wait_for(sub.__anext__(), 30)).id for _ in range(2)]
    await sub.aclose()
    assert got == [e.id for e in events]


async def test_the_agent_watch_never_takes_a_record_stored_before_it_started_for_news(bus):
    """A coordinator that starts after a blackout reads the dead ranks' last records: each key's
    first record is ``stored`` (maybe a dead rank's last word), only a later one is a rank heard
    as it happened. (The saga restarts a job not heard after power returned: a stored record
    taken for news would leave the job dead.)"""
    from powerguard.bus.agents import AgentWatch, announce
    from powerguard.schemas import AgentData, AgentHeartbeat, AgentRegistered

    def data(rank: int, step: int) -> AgentData:
        return AgentData(job="j", rank=rank, world_size=2, node="n1", step=step)

    for rank in range(2):
        await announce(bus, AgentRegistered(source="/t", data=data(rank, 1)))
        await announce(bus, AgentHeartbeat(source="/t", data=data(rank, 2)))
    seen: list[tuple[str, int | None, bool]] = []
    watch = AgentWatch(bus, lambda agent, key, at, stored: seen.append((key, agent and agent.step, stored)))
    await watch.start()
    try:
        await asyncio.wait_for(watch.ready.wait(), 10)
        await announce(bus, AgentHeartbeat(source="/t", data=data(0, 3)))
        await eventually(lambda: len(seen) >= 3, 5, "the watch to see the heartbeat")
        assert sorted(seen[:2]) == [("j.n1.0", 2, True), ("j.n1.1", 2, True)], seen
        assert seen[2:] == [("j.n1.0", 3, False)], seen
    finally:
        await watch.stop()


async def test_last_tells_a_failed_read_from_no_event_when_asked_to(make_bus):
    """``last`` answers None when the subject holds no event; a read nobody answers (here: the
    stream is gone) is None too, or, with ``strict``, a ReadError naming the subject."""
    bus = await make_bus("power-control")
    event = OnBattery(source="/powerguard/test", data=power())
    subject = event.nats_subject(bus.subjects)
    assert await bus.last(subject, strict=True) is None  # no event: not an error
    ack = await bus.publish(event)
    assert (await bus.last(subject, strict=True)).sequence == ack.seq
    await bus.js.delete_stream(bus.names.stream)
    with pytest.raises(ReadError, match=subject):
        await bus.last(subject, strict=True)
    assert await bus.last(subject) is None
