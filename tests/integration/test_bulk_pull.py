"""The consumers' bulk pull (``bus/pull.py``: one JetStream pull request answered into a
subscription callback) against a real nats-server: every message taken once and acknowledged,
nothing a late answer delivered is lost, a status ends only its own request."""

from __future__ import annotations

import asyncio

import pytest
from nats.aio.msg import Msg

from powerguard.bus.consumer import durable_config
from powerguard.bus.pull import BatchPull, next_subject
from powerguard.schemas import OnBattery, PowerData
from tests.waiting import eventually

pytestmark = pytest.mark.integration
TIMEOUT = 10


def event(i: int) -> OnBattery:
    return OnBattery(data=PowerData(site="dc1", ups=f"u{i}", on_battery=True, runtime_s=300.0, charge_pct=90.0))


async def _durable(bus, name: str) -> None:
    cfg = durable_config(name, filters=[OnBattery.wildcard(bus.subjects)], batch=4096)
    await bus.js.add_consumer(bus.names.stream, cfg)


async def _ack_pending(bus, name: str) -> int:
    return (await bus.js.consumer_info(bus.names.stream, name)).num_ack_pending


def _ack_pending_is(bus, name: str, n: int):
    async def check() -> bool:
        return await _ack_pending(bus, name) == n

    return check


async def test_a_bulk_take_gets_every_pending_message_once_in_order_and_each_ack_counts(bus):
    for i in range(300):
        await bus.publish(event(i))
    await _durable(bus, "bulk")
    pull = await BatchPull(bus.nc, bus.names.stream, "bulk").start()
    got = await pull.take(300, timeout=TIMEOUT)
    assert [m.metadata.sequence.consumer for m in got] == list(range(1, 301))
    assert got[-1].metadata.num_pending == 0
    assert await _ack_pending(bus, "bulk") == 300
    for m in got:
        await m.ack()
    await eventually(_ack_pending_is(bus, "bulk", 0), TIMEOUT, "every ack applied")
    assert await pull.take(5, timeout=TIMEOUT) == []  # the server's "no messages" ends the request at once
    await pull.stop()


async def test_messages_that_arrive_after_a_take_gave_up_come_with_the_next_take(bus):
    for i in range(20):
        await bus.publish(event(i))
    await _durable(bus, "late")
    pull = await BatchPull(bus.nc, bus.names.stream, "late").start()
    assert await pull.take(20, timeout=0) == []  # gave up before the answer came
    # the server delivered them to the puller meanwhile: they are held, not dropped
    await eventually(_ack_pending_is(bus, "late", 20), TIMEOUT, "the late answer delivered")
    await bus.publish(event(20))
    got = []

    async def all_taken() -> bool:
        got.extend(await pull.take(1, timeout=TIMEOUT))
        return len(got) >= 21

    await eventually(all_taken, TIMEOUT, "the 20 held messages and the new one taken")
    assert [m.metadata.sequence.consumer for m in got] == list(range(1, 22))
    await pull.stop()


async def test_the_batch_consumer_takes_a_large_backlog_in_bulk_and_acks_every_message(bus):
    n = 2000
    for i in range(n):
        await bus.publish(event(i))
    seen: list[int] = []
    done = asyncio.Event()

    async def handle(items) -> None:
        seen.extend(i.sequence for i in items)
        if len(seen) >= n:
            done.set()

    consumer = await bus.consume_batches(OnBattery, batch_handler=handle, durable="backlog", batch=4096)
    await asyncio.wait_for(done.wait(), TIMEOUT)
    assert sorted(seen) == sorted(set(seen)) and len(seen) == n  # each once, none redelivered
    await eventually(_ack_pending_is(bus, "backlog", 0), TIMEOUT, "every ack applied")
    await consumer.stop()


def test_a_status_ends_only_the_request_it_answers():
    pull = BatchPull(None, "S", "c")  # type: ignore[arg-type]
    pull._inbox, pull._request, pull._open, pull._left = "_INBOX.x", 2, 2, 5

    def status(subject: str, code: str) -> Msg:
        return Msg(None, subject=subject, headers={"Status": code})  # type: ignore[arg-type]

    asyncio.run(pull._on_msg(status("_INBOX.x.1", "404")))  # an earlier request's end
    asyncio.run(pull._on_msg(status("_INBOX.x.2", "100")))  # a heartbeat
    assert pull.open
    asyncio.run(pull._on_msg(status("_INBOX.x.2", "408")))
    assert not pull.open


def test_the_request_subject_is_jetstreams_own_with_or_without_a_domain():
    assert next_subject("S", "c") == "$JS.API.CONSUMER.MSG.NEXT.S.c"
    assert next_subject("S", "c", domain="hub") == "$JS.hub.API.CONSUMER.MSG.NEXT.S.c"


async def test_a_reader_whose_bulk_pulls_give_up_at_once_still_reads_every_event_once_in_order(make_bus, monkeypatch):
    """A bulk pull whose wait ends before its answer (a slow server): what arrives later is
    handed to the reader first, before anything newer, and nothing is read twice."""
    give_up_at_once = BatchPull.take

    async def take(self, n: int, timeout: float):
        return await give_up_at_once(self, n, 0)

    monkeypatch.setattr(BatchPull, "take", take)
    pub, obs = await make_bus("ups-monitor"), await make_bus("observer")
    sent = [event(i) for i in range(200)]
    for e in sent:
        await pub.publish(e)
    sub = await obs.subscribe(OnBattery, deliver="all").start()
    got = [(await asyncio.wait_for(sub.__anext__(), TIMEOUT)).id for _ in sent]
    await sub.aclose()
    assert got == [e.id for e in sent]
