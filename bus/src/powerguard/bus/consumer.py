"""Pull consumers: :class:`Consumer` (durable, handler, ack/nak/term, DLQ) and
:class:`Subscription` (ephemeral async iterator for observers)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Protocol

import nats
from nats.aio.msg import Msg
from nats.js import api
from nats.js import errors as js_errors
from opentelemetry.trace import SpanKind, Status, StatusCode

from powerguard.schemas import Envelope, EventError, StampedInTheFuture, check_subject, decode

from . import metrics
from .dlq_budget import DeadLetterBudget
from .errors import SetupError
from .names import BusNames
from .pull import BatchPull
from .tracing import extract_context, messaging_attributes

if TYPE_CHECKING:
    from nats.aio.client import Client
    from nats.js import JetStreamContext
    from opentelemetry.trace import Tracer

    from powerguard.schemas import Subjects

log = logging.getLogger(__name__)

Handler = Callable[[Envelope], Awaitable[None]]
BatchHandler = Callable[[list["Received"]], Awaitable[None]]


class Bus(Protocol):
    """What a consumer needs of its bus: :class:`~powerguard.bus.client.Bus` is one. The
    consumers never import the client (the client builds them: calls run one way)."""

    nc: Client
    js: JetStreamContext
    names: BusNames
    subjects: Subjects
    tracer: Tracer
    max_payload: int

    async def dead_letter(
        self, *, subject: str, payload: bytes, error: BaseException | str, deliveries: int | None = None
    ) -> None: ...

    def _forget(self, consumer: object) -> None: ...


_DELIVER = {
    "new": api.DeliverPolicy.NEW,
    "all": api.DeliverPolicy.ALL,
    "last": api.DeliverPolicy.LAST,
    "last_per_subject": api.DeliverPolicy.LAST_PER_SUBJECT,
}
_CLOSED = (nats.errors.ConnectionClosedError, nats.errors.ConnectionDrainingError)
# An idle reader asks the server about its consumer this often: a consumer whose server died,
# or that hangs, answers pulls with silence, which looks just like "no new messages".
CHECK_IDLE_S = 5.0
BIND_RETRY_S = 15.0  # how long a consumer waits for JetStream to answer at its start (a cluster recovering)
# A durable refuses (dead-letters) an event stamped further than this ahead of its own clock,
# whoever sent it: above the worst offset between two hosts' clocks (the fault campaign runs
# services up to 60 s off), far below what would let a forged reading hide the true ones.
MAX_CLOCK_SKEW_S = 90.0
ADMIT_YIELD_EVERY = 64  # messages decoded between two turns of the event loop to the other tasks


def covers(wide: str, narrow: str) -> bool:
    """True when every subject matched by ``narrow`` is matched by ``wide``."""
    w, n = wide.split("."), narrow.split(".")
    for i, tok in enumerate(w):
        if tok == ">":
            return len(n) > i
        if i >= len(n):
            return False
        if tok != "*" and tok != n[i]:
            return False
        if tok == "*" and n[i] == ">":
            return False
    return len(w) == len(n)


def filter_subjects(bus: Bus, types: Sequence[type[Envelope]], subject: str | list[str] | None) -> list[str]:
    if subject is not None:
        wanted = [subject] if isinstance(subject, str) else list(subject)
    elif types:
        wanted = [t.wildcard(bus.subjects) for t in types]
    else:
        wanted = [bus.subjects.all]
    unique: list[str] = []
    for s in dict.fromkeys(wanted):
        if not any(s != other and covers(other, s) for other in wanted):
            unique.append(s)
    return unique


@dataclass(frozen=True)
class Received:
    event: Envelope
    subject: str
    headers: dict[str, str]
    sequence: int
    stored_at: float | None = None  # when JetStream stored it (the server's clock, Unix time)

    @property
    def trace_id(self) -> str | None:
        parts = self.headers.get("traceparent", "").split("-")
        return parts[1] if len(parts) == 4 else None


def decode_on(bus: Bus, data: bytes, subject: str) -> Envelope:
    """Decode a payload and check that its type and data belong on the subject it came on
    (raises :class:`~powerguard.schemas.EventError`, e.g. ``SubjectMismatch``)."""
    return check_subject(decode(data or b"", max_bytes=bus.max_payload), subject, bus.subjects)


def check_stamp(
    event: Envelope, now: float, max_skew_s: float = MAX_CLOCK_SKEW_S, stored_at: float | None = None
) -> Envelope:
    """The event itself, or :class:`~powerguard.schemas.StampedInTheFuture` when the time it was
    stored at (``stored_at``: JetStream's own stamp, the server's clock; else the publisher's
    ``time``) is more than ``max_skew_s`` ahead of ``now``. The publisher's clock is never judged
    where the server's stamp is known: a publisher minutes off is still heard, its time kept for
    ordering only."""
    ahead = (stored_at if stored_at is not None else event.time.timestamp()) - now
    if ahead > max_skew_s:
        raise StampedInTheFuture(event.short_type, ahead, max_skew_s)
    return event


def durable_config(
    name: str,
    *,
    filters: list[str] | None = None,
    deliver: str = "all",
    ack_wait: float = 30.0,
    max_deliver: int = 5,
    batch: int = 512,
    since_s: float | None = None,
) -> api.ConsumerConfig:
    """A durable's configuration (services and ``powerguard bootstrap`` build it here)."""
    cfg = api.ConsumerConfig(
        durable_name=name,
        deliver_policy=_DELIVER[deliver],
        ack_policy=api.AckPolicy.EXPLICIT,
        ack_wait=ack_wait,
        max_deliver=max_deliver + 1,  # the last delivery goes to the DLQ, where it is terminated
        max_ack_pending=max(1000, batch * 4),
    )
    if since_s is not None:
        # a durable that is (re-)created starts from a safe point: recent input only, never a
        # replay of days-old history (state lives in KV, not in the stream)
        cfg.deliver_policy = api.DeliverPolicy.BY_START_TIME
        cfg.opt_start_time = datetime.now(UTC) - timedelta(seconds=since_s)
    if filters:
        if len(filters) == 1:
            cfg.filter_subject = filters[0]
        else:
            cfg.filter_subjects = list(filters)
    return cfg


class _PullLoop:
    durable: str | None = None

    def __init__(
        self, bus: Bus, types: Sequence[type[Envelope]], *, subject: str | list[str] | None, deliver: str
    ) -> None:
        if deliver not in _DELIVER:
            raise ValueError(f"deliver must be one of {', '.join(_DELIVER)}")
        self.bus = bus
        self.types = tuple(types)
        parts = bus.names.split(filter_subjects(bus, self.types, subject))
        if len(parts) != 1:
            raise ValueError(f"a consumer reads one stream; {subject or types} spans {', '.join(parts)}")
        ((self.stream, self.filters),) = parts.items()
        self.deliver = deliver
        self.name = ""
        self._psub = None
        self._bulk: BatchPull | None = None
        self._carried: list[Msg] = []  # delivered to a bulk pull after its wait ended, not yet handled
        self._last_seq: int | None = None
        self._stopping = False
        self._checked = time.monotonic()
        self._pending_seen = False

    def _config(self) -> api.ConsumerConfig:  # pragma: no cover - overridden
        raise NotImplementedError

    async def _bind(self) -> None:
        resume = self.durable is None and self._last_seq is not None
        if resume and self.name:
            # resume after the last message seen, on a fresh consumer: the old one may still exist
            # (a leader change, not a loss) and its deliver policy cannot be updated (err 10012)
            try:
                await self.bus.js.delete_consumer(self.stream, self.name)
            except (nats.errors.Error, js_errors.Error, TimeoutError):
                pass
        cfg = self._config()
        if len(self.filters) == 1:
            cfg.filter_subject = self.filters[0]
        else:
            cfg.filter_subjects = self.filters
        if resume:
            cfg.deliver_policy = api.DeliverPolicy.BY_START_SEQUENCE
            cfg.opt_start_seq = self._last_seq + 1
        if self.durable is None:
            # named by the server: created through the endpoint that refuses a durable, the one
            # a read-only credential (observer, operator) may use
            cfg.name = None
            self.name = (await self.bus.js.add_consumer(self.stream, cfg)).name
        elif not await self._durable_exists(cfg):
            await self.bus.js.add_consumer(self.stream, cfg)
        self._psub = await self.bus.js.pull_subscribe_bind(consumer=self.name, stream=self.stream)
        self._bulk = await BatchPull(self.bus.nc, self.stream, self.name, domain=self.bus.js_domain).start()

    async def _bind_when_available(self, within_s: float = BIND_RETRY_S) -> None:
        """:meth:`_bind`, retried while JetStream answers that it is not available yet (503: a
        cluster electing its leaders after a restart or a power cut; a request timing out
        meanwhile), for at most ``within_s``; then the error, with what it waited for."""
        loop = asyncio.get_running_loop()
        deadline, wait = loop.time() + within_s, 0.25
        while True:
            try:
                return await self._bind()
            except (js_errors.ServiceUnavailableError, nats.errors.TimeoutError, TimeoutError) as exc:
                if loop.time() + wait > deadline:
                    raise SetupError(
                        f"consumer {self.name or '(new)'} on stream {self.stream}: JetStream still "
                        f"unavailable after {within_s:.0f}s ({exc!r})"
                    ) from exc
                log.info("consumer %s on %s: JetStream not available yet (%r); retrying", self.name, self.stream, exc)
                await asyncio.sleep(wait)
                wait = min(wait * 2, 2.0)

    async def _durable_exists(self, want: api.ConsumerConfig) -> bool:
        """A durable that exists is used as it is (created by ``powerguard bootstrap`` or an
        earlier run): services never update consumers; a different filter is logged."""
        try:
            info = await self.bus.js.consumer_info(self.stream, self.name)
        except js_errors.NotFoundError:
            return False
        have = sorted(info.config.filter_subjects or [info.config.filter_subject or ""])
        need = sorted(want.filter_subjects or [want.filter_subject or ""])
        if have != need:
            log.warning("consumer %s filters %s, this service expects %s: using it as it is", self.name, have, need)
        if 0 < (info.config.max_ack_pending or 0) < (want.max_ack_pending or 0):
            log.warning(
                "consumer %s holds at most %d unacknowledged messages (this service wants %d): "
                "run `powerguard bootstrap --update`",
                self.name,
                info.config.max_ack_pending,
                want.max_ack_pending,
            )
        return True

    async def _stalled(self) -> bool:
        """After an empty or failed pull: whether to re-create the binding. At most every
        :data:`CHECK_IDLE_S` the server is asked about the consumer; gone, not answering, or
        holding undelivered messages at two checks in a row all mean a stalled reader.
        Re-binding loses nothing: a durable keeps its place, an ephemeral resumes after the
        last message read."""
        now = time.monotonic()
        if self._psub is None or now - self._checked < CHECK_IDLE_S:
            return False
        self._checked = now
        try:
            info = await self.bus.js.consumer_info(self.stream, self.name, timeout=2.0)
        except (nats.errors.Error, js_errors.Error, TimeoutError) as exc:
            log.info("consumer %s did not answer (%r); re-creating", self.name, exc)
            return True
        pending = (info.num_pending or 0) > 0
        stalled, self._pending_seen = pending and self._pending_seen, pending
        if stalled:
            log.info(
                "consumer %s holds %d undelivered messages but delivers none; re-binding", self.name, info.num_pending
            )
            self._pending_seen = False
        return stalled

    async def _unbind(self) -> None:
        psub, self._psub = self._psub, None
        bulk, self._bulk = self._bulk, None
        if psub is not None:
            with contextlib.suppress(nats.errors.Error, TimeoutError):
                await psub.unsubscribe()
        if bulk is not None:
            self._carried += bulk.held()
            with contextlib.suppress(nats.errors.Error, TimeoutError):
                await bulk.stop()

    async def _fetch(self, batch: int) -> list[Msg]:
        """Wait up to ~1 s for messages; survive reconnects and lost consumers."""
        retry = 0.1
        while not self._stopping:
            # a bulk pull still being answered, and what one brought after its wait ended, come
            # first: they are older than anything a new request would bring
            if self._bulk is not None and self._bulk.open:
                msgs, self._carried = self._carried + await self._bulk.settle(1.0), []
                return self._took(msgs)
            msgs, self._carried = self._carried + (self._bulk.held() if self._bulk else []), []
            if msgs:
                return self._took(msgs)
            try:
                if self._psub is None:
                    await self._bind()
                # One message first: a lingering pull for N messages would hold the first one back
                # until N arrived or the request expired. Then, when the server says more are
                # pending, take them at once (that pull returns without lingering), in one
                # request answered into a callback (nats.py's fetch costs a task per message).
                msgs = await self._psub.fetch(1, timeout=1.0)
                pending = msgs[-1].metadata.num_pending or 0 if msgs else 0
                if batch > 1 and pending > 0 and self._bulk is not None:
                    msgs += await self._bulk.take(min(batch - 1, pending), timeout=1.0)
            except nats.errors.TimeoutError:
                if await self._stalled():
                    await self._unbind()
                    continue
                return []
            except _CLOSED:
                self._stopping = True
                return []
            except (js_errors.NotFoundError, js_errors.ServiceUnavailableError, js_errors.APIError) as exc:
                log.info("consumer %s unavailable (%s); re-creating", self.name, exc)
                await self._unbind()
            except (nats.errors.Error, OSError, TimeoutError) as exc:
                log.debug("fetch on %s failed: %r", self.name, exc)
                if await self._stalled():
                    await self._unbind()
            else:
                return self._took(msgs)
            await asyncio.sleep(retry)
            retry = min(retry * 2, 1.0)
        return []

    def _took(self, msgs: list[Msg]) -> list[Msg]:
        if msgs:
            self._last_seq = msgs[-1].metadata.sequence.stream
            self._checked, self._pending_seen = time.monotonic(), False
        return msgs


class Consumer(_PullLoop):
    """A durable consumer running a handler per event. Start it with :meth:`Bus.consume`."""

    def __init__(
        self,
        bus: Bus,
        types: Sequence[type[Envelope]],
        *,
        handler: Handler,
        durable: str,
        subject: str | list[str] | None,
        max_deliver: int,
        backoff: tuple[float, ...],
        ack_wait: float,
        deliver: str,
        batch: int = 16,
        since_s: float | None = None,
        max_skew_s: float = MAX_CLOCK_SKEW_S,
    ) -> None:
        super().__init__(bus, types, subject=subject, deliver=deliver)
        self.since_s = since_s
        self.max_skew_s = max_skew_s
        self.dead_letters = DeadLetterBudget()
        if max_deliver < 1:
            raise ValueError("max_deliver must be at least 1")
        self.handler = handler
        self.durable = self.name = durable
        self.max_deliver = max_deliver
        self.backoff = backoff or (1.0,)
        self.ack_wait = ack_wait
        self.batch = batch
        self._task: asyncio.Task | None = None
        self._busy = False  # True while a batch is being handled (never cancel then)

    def _config(self) -> api.ConsumerConfig:
        return durable_config(
            self.durable,
            deliver=self.deliver,
            ack_wait=self.ack_wait,
            max_deliver=self.max_deliver,
            batch=self.batch,
            since_s=self.since_s,
        )

    async def start(self) -> None:
        await self._bind_when_available()
        self._task = asyncio.create_task(self._run(), name=f"consumer:{self.name}")

    async def stop(self, timeout: float = 3.0) -> None:
        self._stopping = True
        if self._task is not None and not self._busy:
            self._task.cancel()  # parked in fetch: nothing to finish
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), timeout)
            except TimeoutError:
                self._task.cancel()
            except asyncio.CancelledError:
                pass
            self._task = None
        await self._unbind()
        self.bus._forget(self)

    async def _run(self) -> None:
        while not self._stopping:
            msgs = await self._fetch(batch=self.batch)
            self._busy = True
            try:
                admitted = []
                for i, m in enumerate(msgs):
                    if i % ADMIT_YIELD_EVERY == ADMIT_YIELD_EVERY - 1:
                        await asyncio.sleep(0)  # a batch of junk never holds the event loop (the power consumer)
                    if (r := await self._admit(m)) is not None:
                        admitted.append(r)
                if admitted:
                    await self._dispatch(admitted)
            except _CLOSED:
                return
            except Exception:  # never let one batch kill the loop
                log.exception("consumer %s: unexpected error processing messages", self.name)
            finally:
                self._busy = False

    async def _admit(self, msg: Msg) -> tuple[Msg, Received] | None:
        """Decode; refuse (dead-letter) what cannot be handled; ack and skip other types."""
        deliveries = msg.metadata.num_delivered or 1
        try:
            stored_at = msg.metadata.timestamp.timestamp() if msg.metadata.timestamp else None
            event = check_stamp(decode_on(self.bus, msg.data, msg.subject), time.time(), self.max_skew_s, stored_at)
        except EventError as exc:
            metrics.CONSUMED.labels(self.name, "rejected").inc()
            await self._refuse(msg, exc, deliveries)
            return None
        if self.types and not isinstance(event, self.types):
            await msg.ack()
            return None
        if deliveries > self.max_deliver:  # the handler failed every time it was allowed to
            await self.bus.dead_letter(
                subject=msg.subject,
                payload=msg.data,
                deliveries=deliveries - 1,
                error=f"handler failed {deliveries - 1} times",
            )
            metrics.CONSUMED.labels(self.name, "dead").inc()
            await msg.term()
            return None
        rec = Received(
            event=event,
            subject=msg.subject,
            headers=dict(msg.headers or {}),
            sequence=msg.metadata.sequence.stream,
            stored_at=stored_at,
        )
        return msg, rec

    async def _refuse(self, msg: Msg, exc: EventError, deliveries: int) -> None:
        """Terminate a message nobody may handle; copy it to the DLQ within the consumer's
        dead-letter budget (a flood of junk costs a decode each, not a stored copy each)."""
        now = time.monotonic()
        if self.dead_letters.take(now):
            await self.bus.dead_letter(subject=msg.subject, payload=msg.data, error=exc, deliveries=deliveries)
        else:
            metrics.DEAD_LETTERS_SUPPRESSED.labels(self.name, type(exc).__name__).inc()
            self.dead_letters.suppressed(type(exc).__name__, msg.subject)
            if (said := self.dead_letters.report(now)) is not None:
                log.error("consumer %s: %s", self.name, said)
        await msg.term()

    async def _dispatch(self, admitted: list[tuple[Msg, Received]]) -> None:
        for msg, rec in admitted:
            await self._handle_one(msg, rec)

    async def _handle_one(self, msg: Msg, rec: Received) -> None:
        event = rec.event
        template = type(event).subject_template(self.bus.subjects.prefix)
        started = time.perf_counter()
        with self.bus.tracer.start_as_current_span(
            f"process {template}",
            context=extract_context(msg.headers),
            kind=SpanKind.CONSUMER,
            attributes=messaging_attributes(
                operation="process",
                subject=msg.subject,
                template=template,
                message_id=event.id,
                event_type=event.type,
                consumer=self.name,
            ),
        ) as span:
            span.set_attribute("messaging.nats.delivery_count", msg.metadata.num_delivered or 1)
            try:
                await self.handler(event)
            except Exception as exc:
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, str(exc)))
                await self._failed(msg, exc, describe=f"{event.short_type} {event.id}")
                return
            finally:
                metrics.HANDLER_SECONDS.labels(self.name).observe(time.perf_counter() - started)
        await msg.ack()
        metrics.CONSUMED.labels(self.name, "ok").inc()

    async def _failed(self, msg: Msg, exc: Exception, *, describe: str) -> None:
        deliveries = msg.metadata.num_delivered or 1
        delay = self.backoff[min(deliveries - 1, len(self.backoff) - 1)]
        log.warning(
            "consumer %s: handler failed for %s (delivery %d/%d, retry in %.1fs): %s",
            self.name,
            describe,
            deliveries,
            self.max_deliver,
            delay,
            exc,
        )
        metrics.CONSUMED.labels(self.name, "failed").inc()
        if deliveries >= self.max_deliver:
            await self.bus.dead_letter(subject=msg.subject, payload=msg.data, error=exc, deliveries=deliveries)
            await msg.term()
        else:
            await msg.nak(delay=delay)


class BatchConsumer(Consumer):
    """A durable consumer whose handler takes every admitted event of one fetch at once
    (with subjects and headers): one state write per batch instead of one per event.
    Success acks the batch; an exception naks (or dead-letters) each of its messages."""

    def __init__(self, *args, batch_handler: BatchHandler, **kwargs) -> None:
        super().__init__(*args, handler=None, **kwargs)  # type: ignore[arg-type]
        self.batch_handler = batch_handler

    async def _dispatch(self, admitted: list[tuple[Msg, Received]]) -> None:
        started = time.perf_counter()
        try:
            await self.batch_handler([rec for _, rec in admitted])
        except Exception as exc:
            for msg, rec in admitted:
                await self._failed(msg, exc, describe=f"{rec.event.short_type} {rec.event.id}")
            return
        finally:
            metrics.HANDLER_SECONDS.labels(self.name).observe(time.perf_counter() - started)
        for msg, _ in admitted:
            await msg.ack()
        metrics.CONSUMED.labels(self.name, "ok").inc(len(admitted))


class Subscription(_PullLoop):
    """Ephemeral iterator over decoded events; use ``async for`` (and ``async with`` to close)."""

    def __init__(
        self,
        bus: Bus,
        types: Sequence[type[Envelope]],
        *,
        subject: str | list[str] | None,
        deliver: str,
        on_error: Callable[[str, bytes, Exception], None] | None,
    ) -> None:
        super().__init__(bus, types, subject=subject, deliver=deliver)
        self.on_error = on_error
        self._buffer: list[Msg] = []

    def _config(self) -> api.ConsumerConfig:
        return api.ConsumerConfig(
            deliver_policy=_DELIVER[self.deliver],
            ack_policy=api.AckPolicy.NONE,
            inactive_threshold=30.0,
            mem_storage=True,
        )

    async def start(self) -> Subscription:
        """Create the consumer now (otherwise the first iteration does)."""
        if self._psub is None:
            try:
                await self._bind()
            except js_errors.NotFoundError:
                raise SetupError(
                    f"stream {self.stream} does not exist yet: no PowerGuard service has connected "
                    "to this server (they create it), or --stream/--prefix name another deployment"
                ) from None
        return self

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Envelope:
        return (await self.next_received()).event

    async def next_received(self) -> Received:
        """The next matching event with its subject, headers and stream sequence."""
        while True:
            if self._stopping:
                raise StopAsyncIteration
            if not self._buffer:
                self._buffer = await self._fetch(batch=64)
                continue
            msg = self._buffer.pop(0)
            try:
                event = decode_on(self.bus, msg.data, msg.subject)
            except EventError as exc:
                if self.on_error:
                    self.on_error(msg.subject, msg.data, exc)
                else:
                    log.warning("skipping undecodable message on %s: %s", msg.subject, exc)
                continue
            if self.types and not isinstance(event, self.types):
                continue
            return Received(
                event=event,
                subject=msg.subject,
                headers=dict(msg.headers or {}),
                sequence=msg.metadata.sequence.stream,
            )

    async def aclose(self) -> None:
        self._stopping = True
        await self._unbind()
        if not self.name:
            return
        try:
            await self.bus.js.delete_consumer(self.stream, self.name)
        except (nats.errors.Error, js_errors.Error, TimeoutError):
            pass

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _read_outcome(task: asyncio.Task) -> None:
    if not task.cancelled():
        task.exception()


class Merged:
    """One iterator over ephemeral subscriptions of both streams (an observer reading subjects
    of the site's events and of the jobs' traffic together); events of the two interleave in
    the order they arrive, each stream's in its own order."""

    def __init__(self, parts: list[Subscription]) -> None:
        self.parts = parts
        self._next: dict[int, asyncio.Task] = {}

    async def start(self) -> Merged:
        for p in self.parts:
            await p.start()
        return self

    def __aiter__(self) -> Merged:
        return self

    async def __anext__(self) -> Envelope:
        return (await self.next_received()).event

    async def next_received(self) -> Received:
        while True:
            for i, p in enumerate(self.parts):
                if i not in self._next and not p._stopping:
                    self._next[i] = asyncio.create_task(p.next_received())
                    # a reader that leaves its `async for` (break, return) leaves the reads in
                    # flight; a part stopped later ends its read with StopAsyncIteration, which is
                    # read here, or asyncio prints "Task exception was never retrieved"
                    self._next[i].add_done_callback(_read_outcome)
            if not self._next:
                raise StopAsyncIteration
            try:
                done, _ = await asyncio.wait(self._next.values(), return_when=asyncio.FIRST_COMPLETED)
            except asyncio.CancelledError:  # the reader was cancelled: its reads go with it
                self._drop_reads()
                raise
            for i, task in sorted(self._next.items()):
                if task in done:
                    del self._next[i]
                    try:
                        return task.result()
                    except StopAsyncIteration:
                        continue

    def _drop_reads(self) -> None:
        """Cancel the parts' reads in flight (what one already ended with is read by
        :func:`_read_outcome`, its done callback)."""
        for task in self._next.values():
            task.cancel()
        self._next = {}

    async def aclose(self) -> None:
        self._drop_reads()
        for p in self.parts:
            await p.aclose()

    async def __aenter__(self) -> Merged:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class Listener:
    """Live events from a core NATS subscription, decoded and checked against their subject;
    ``async for`` over it (``async with`` closes it). Bad input is logged and skipped."""

    def __init__(self, bus: Bus, types: Sequence[type[Envelope]], *, subject: str, buffer: int = 1024) -> None:
        self.bus, self.types, self.subject = bus, tuple(types), subject
        self._queue: asyncio.Queue[Received] = asyncio.Queue(maxsize=buffer)
        self._sub = None

    async def start(self) -> Listener:
        if self._sub is None:
            self._sub = await self.bus.nc.subscribe(self.subject, cb=self._on_msg)
            await self.bus.nc.flush()  # the server has the subscription before we go on
        return self

    async def _on_msg(self, msg: Msg) -> None:
        try:
            event = decode_on(self.bus, msg.data, msg.subject)
        except EventError as exc:
            log.warning("ignoring message on %s: %s", msg.subject, exc)
            return
        if self.types and not isinstance(event, self.types):
            return
        rec = Received(event=event, subject=msg.subject, headers=dict(msg.headers or {}), sequence=0)
        try:
            self._queue.put_nowait(rec)
        except asyncio.QueueFull:
            log.error("listener on %s: %d events not taken; dropping %s", self.subject, self._queue.qsize(), event.id)

    def __aiter__(self) -> Listener:
        return self

    async def __anext__(self) -> Envelope:
        return (await self.next_received()).event

    async def next_received(self) -> Received:
        await self.start()
        return await self._queue.get()

    async def aclose(self) -> None:
        sub, self._sub = self._sub, None
        if sub is not None:
            with contextlib.suppress(nats.errors.Error, TimeoutError):
                await sub.unsubscribe()

    async def __aenter__(self) -> Listener:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
