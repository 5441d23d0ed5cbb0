"""The agent's NATS side: its own asyncio loop in a daemon thread, so training never waits on
the network. It only moves messages: registers the rank and heartbeats what the rank's
progress says (``_progress.Progress``, written by the agent alone), hands checkpoint requests
and releases to the request queue (``_requests.RequestQueue``, pure), publishes acks, and
answers ``ckpt.failed`` for a request whose deadline passes before this rank acked (a hung
training loop cannot leave the coordinator guessing)."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

from opentelemetry import context as otel_context

from powerguard.bus import Bus, BusNames, ConnectError, RegistrationRefused
from powerguard.bus.agents import announce
from powerguard.bus.env import auth_options
from powerguard.bus.reconnect import Backoff, FailureLog
from powerguard.bus.roles import inbox
from powerguard.schemas import (
    AgentData,
    AgentDeregistered,
    AgentHeartbeat,
    AgentRegistered,
    CheckpointFailed,
    CheckpointFailedData,
    CheckpointRecorded,
    CheckpointRequestData,
    CheckpointRequested,
    CheckpointTriggered,
    Envelope,
    HoldReleased,
    RecordedData,
)

from ._progress import Progress
from ._requests import Request, RequestQueue

log = logging.getLogger(__name__)


class BusThread:
    def __init__(
        self,
        *,
        url: str,
        names: BusNames,
        agent: AgentData,
        progress: Progress | None = None,
        heartbeat_s: float = 5.0,
        connect_timeout: float = 10.0,
        auth: dict | None = None,
    ) -> None:
        self.url, self.names, self.agent = url, names, agent
        self.auth = auth if auth is not None else auth_options()
        self.heartbeat_s = heartbeat_s
        self.connect_timeout = connect_timeout
        self.progress = progress if progress is not None else Progress()  # the agent's: read here, never written
        self.queue = RequestQueue()  # under self._lock: the bus thread feeds it, the training thread asks
        self.started_at = time.time()
        self.bus: Bus | None = None
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=f"pg-ckpt-bus-{agent.rank}", daemon=True)
        self._ready: Future = Future()
        self._stop: asyncio.Event | None = None
        self._lock = threading.Lock()
        self.http_port: int | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start the thread; wait up to ``connect_timeout`` for the first connection. Without
        NATS, training starts anyway: the thread keeps connecting and says so (checkpoint
        requests reach this rank once it is connected; periodic saves go on meanwhile)."""
        self._thread.start()
        try:
            self._ready.result(timeout=self.connect_timeout + 5)
        except Exception as exc:
            log.warning(
                "rank %d: NATS not reachable (%s); training starts and the agent keeps connecting",
                self.agent.rank,
                exc,
            )

    def close(self, timeout: float = 5.0) -> None:
        if not self._thread.is_alive():
            return
        if self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._main())
        finally:
            self.loop.close()

    async def _connect(self):
        # the least trusted party: a credential for its own job (NATS_CREDS), never stream setup
        bus = await Bus.connect(
            self.url,
            service=f"ckpt-agent-{self.agent.job}-{self.agent.rank}",
            names=self.names,
            connect_timeout=self.connect_timeout,
            # its credential's inbox; behind a node's leaf nats-server (no credential of its own)
            # the only one the leaf's may subscribe to, and the site's JetStream through its domain
            inbox_prefix=inbox("agent", self.agent.job),
            js_domain=os.environ.get("NATS_JS_DOMAIN") or None,
            setup=False,
            **self.auth,
        )
        try:
            # listen first, then register: a request sent as soon as the registration is seen must
            # not be missed; plain subscriptions on its own job's subjects (no JetStream consumer)
            s = bus.subjects
            sub = await bus.listen(CheckpointRequested, subject=s.ckpt_request(self.agent.job)).start()
            trig = await bus.listen(CheckpointTriggered, subject=s.ckpt_trigger(self.agent.job)).start()
            rel = await bus.listen(HoldReleased, subject=s.ckpt_release(self.agent.job)).start()
            self.bus = bus
            await self._catch_up()
            await self._register()
        except BaseException:
            self.bus = None
            await bus.close()
            raise
        return sub, trig, rel

    async def _main(self) -> None:
        """Connect, serve, and when the server closes the connection for good (the credential
        revoked or expired: nats.py does not reconnect then) connect again, backing off: 1 s, 2 s,
        ... 60 s between tries (±20 %), one log line per while with a count."""
        self._stop = asyncio.Event()
        backoff = Backoff(base_s=1.0, unreachable_cap_s=30.0, refused_cap_s=60.0)
        said = FailureLog()
        while not self._stop.is_set():
            try:
                sub, trig, rel = await self._connect()
            except Exception as exc:
                if not self._ready.done():
                    self._ready.set_exception(exc)  # start() says so once; training goes on
                backoff.failed(exc)
                if line := said.note(exc, time.monotonic(), backoff.nominal()):
                    log.warning("rank %d: %s", self.agent.rank, line)
                try:
                    await asyncio.wait_for(self._stop.wait(), backoff.delay())
                    return  # closed before it could connect
                except TimeoutError:
                    continue
            backoff.connected()
            said.connected()
            if self._ready.done():
                log.info("rank %d: connected to NATS", self.agent.rank)
            else:
                self._ready.set_result(None)
            if not await self._serve(sub, trig, rel):
                return

    async def _serve(self, sub, trig, rel) -> bool:
        """Serve until closed (False) or until the server closed the connection (True: connect
        again)."""
        tasks = [
            asyncio.create_task(self._receive(sub, self._take)),
            asyncio.create_task(self._receive(trig, self._take)),
            asyncio.create_task(self._receive(rel, self._take_release)),
            asyncio.create_task(self._catch_up_after_reconnects()),
            asyncio.create_task(self._heartbeat()),
            asyncio.create_task(self._watchdog()),
        ]
        stop = asyncio.ensure_future(self._stop.wait())
        lost = asyncio.ensure_future(self.bus.lost.wait())
        await asyncio.wait({stop, lost}, return_when=asyncio.FIRST_COMPLETED)
        for t in (*tasks, stop, lost):
            t.cancel()
        if not self._stop.is_set():
            err = self.bus.nc.last_error
            log.error(
                "rank %d: the NATS server closed this rank's connection (%s): checkpoint requests cannot reach it; "
                "connecting again (a revoked or expired credential: issue a new one)",
                self.agent.rank,
                err or "no reason given",
            )
            self.bus = None
            return True
        try:
            await announce(self.bus, AgentDeregistered(source=self.source, data=self._data()))
        except Exception as exc:
            log.debug("deregistration failed: %s", exc)
        for subscription in (sub, trig, rel):
            await subscription.aclose()
        await self.bus.drain()
        return False

    @property
    def source(self) -> str:
        """The CloudEvents source of this rank's events."""
        return f"/powerguard/ckpt-agent/{self.agent.job}/{self.agent.rank}"

    def _data(self) -> AgentData:
        p = self.progress
        return self.agent.model_copy(
            update={
                "step": p.step,
                "last_committed_step": p.last_committed_step,
                "pid": os.getpid(),
                "heartbeat_s": self.heartbeat_s,
                "paused_step": p.paused_step,
            }
        )

    # ------------------------------------------------------------------ loops
    @staticmethod
    async def _receive(sub, take) -> None:
        """Hand every event of a subscription to ``take`` until it closes."""
        while True:
            try:
                received = await sub.next_received()
            except StopAsyncIteration:
                return
            take(received)

    def _take(self, received) -> None:
        event = received.event
        assert isinstance(event, CheckpointRequested | CheckpointTriggered)
        with self._lock:
            what = self.queue.take(event.data, now=time.time(), traceparent=received.headers.get("traceparent"))
        if what == "new":
            log.info("checkpoint requested: %s (deadline %s)", event.data.request_id, event.data.deadline)
        elif what == "deadline":
            log.info("checkpoint %s: deadline moved to %s", event.data.request_id, event.data.deadline)

    async def _catch_up(self) -> None:
        """What was published while this rank was not listening: the job's newest request (if
        its deadline has not passed) and release."""
        s = self.bus.subjects
        last = await self.bus.last(s.ckpt_request(self.agent.job))
        # only a request made while this process lived: an older one was for the job's previous
        # incarnation (answered, or moot) - a restarted job must not pause on its final request
        if (
            last is not None
            and last.event.time.timestamp() >= self.started_at
            and last.event.data.deadline.timestamp() > time.time()
        ):
            self._take(last)
        released = await self.bus.last(s.ckpt_release(self.agent.job))
        if released is not None:
            with self._lock:
                self.queue.release(released.event.data.saga_id)

    async def _catch_up_after_reconnects(self) -> None:
        while True:
            await self.bus.wait_reconnected()
            log.info("reconnected: looking for requests sent meanwhile")
            await self._catch_up()

    def _take_release(self, received) -> None:
        with self._lock:
            self.queue.release(received.event.data.saga_id)
        log.info("hold released (saga %s): %s", received.event.data.saga_id, received.event.data.reason)

    async def _register(self) -> None:
        """Register the rank. A registration the server refuses on a live connection (the
        registry's bucket full) is logged as an error naming the cause, and the rank stays
        connected and subscribed to its job's requests: its registration went out as an event on
        its job's own subject, which the coordinator's book of known jobs hears, and each
        heartbeat registers again."""
        try:
            await announce(self.bus, AgentRegistered(source=self.source, data=self._data()))
        except RegistrationRefused as exc:  # the registration still went out as an event
            log.error(
                "rank %d of job %s: registration refused (%s); still listening for checkpoint requests, "
                "registering again at each heartbeat",
                self.agent.rank,
                self.agent.job,
                exc,
            )

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_s)
            await self._beat()

    async def _beat(self) -> None:
        try:
            await announce(self.bus, AgentHeartbeat(source=self.source, data=self._data()))
        except Exception as exc:
            log.warning("heartbeat failed: %s", exc)

    async def _watchdog(self) -> None:
        """A request this rank has not answered by its deadline gets ckpt.failed."""
        while True:
            await asyncio.sleep(0.2)
            with self._lock:
                late = self.queue.overdue(time.time())
            step = self.progress.step
            for r in late:
                await self._publish(
                    CheckpointFailed(
                        source=self.source,
                        data=CheckpointFailedData(
                            request_id=r.data.request_id,
                            saga_id=r.data.saga_id,
                            job=self.agent.job,
                            rank=self.agent.rank,
                            world_size=self.agent.world_size,
                            step=step,
                            error=f"rank {self.agent.rank}: no checkpoint by the deadline; the loop did not "
                            f"reach a step boundary (last at step {step}): a long evaluation or other "
                            "work between steps? wrap it in guard.quiescent()",
                            error_type="StepAgreementTimeout",
                        ),
                    )
                )

    async def _publish(self, event: Envelope, ctx: otel_context.Context | None = None) -> None:
        token = otel_context.attach(ctx) if ctx is not None else None
        try:
            await self.bus.publish(event)
        except Exception as exc:
            log.error("could not publish %s: %s", event.short_type, exc)
        finally:
            if token is not None:
                otel_context.detach(token)

    # ------------------------------------------------------------------ training-thread API
    def released(self, sagas: set[str | None]) -> bool:
        """A release arrived for every one of these sagas (each saga that paused the ranks)."""
        with self._lock:
            return self.queue.all_released(sagas)

    def beat_now(self) -> None:
        """A heartbeat now (the progress changed in a way the registry must hear at once: a pause)."""
        asyncio.run_coroutine_threadsafe(self._beat(), self.loop)

    def pending(self) -> Request | None:
        """The newest request not answered yet (older ones are covered by the same checkpoint)."""
        with self._lock:
            return self.queue.pending()

    def answer(
        self, requests: list[CheckpointRequestData], event_for: Callable, ctx: otel_context.Context | None = None
    ) -> None:
        """Publish one ack per request (built by ``event_for(request)``; None: another rank
        answers it for this one), from any thread. A request another rank saw first is answered
        too, and ignored when it arrives here later."""
        with self._lock:
            todo = self.queue.answer(requests)
        for r in todo:
            if (event := event_for(r)) is not None:
                asyncio.run_coroutine_threadsafe(self._publish(event, ctx), self.loop)

    def publish(self, event: Envelope, timeout: float = 10.0) -> None:
        """Publish from the training thread and wait until it is stored."""
        if self.bus is None:
            raise ConnectError("the agent is not connected to NATS (yet)")
        asyncio.run_coroutine_threadsafe(self.bus.publish(event), self.loop).result(timeout)

    def publish_nowait(self, event: Envelope, ctx: otel_context.Context | None = None) -> None:
        """Publish from the training thread without waiting (errors are logged)."""
        asyncio.run_coroutine_threadsafe(self._publish(event, ctx), self.loop)

    def recorded(self, timeout: float = 10.0) -> RecordedData | None:
        """What the coordinator last recorded for this job (``pg.ckpt.<job>.recorded``): the step
        every rank acked durable and the COMMIT the acks named. None when nothing is recorded, or
        when it cannot be read now (not connected, no answer: logged)."""
        if self.bus is None:
            log.warning("rank %d: not connected: the coordinator's record of this job is not read", self.agent.rank)
            return None
        stored = None
        try:  # its own store first (no age limit); a site before that store: the event
            stored = self.run(self.bus.floor(self.agent.job), timeout)
        except Exception as exc:
            log.info("rank %d: the restore floor's store not read (%s): reading the event", self.agent.rank, exc)
        try:
            got = stored or self.run(self.bus.last(self.bus.subjects.ckpt_recorded(self.agent.job)), timeout)
        except Exception as exc:
            log.warning("rank %d: the coordinator's record of this job not read: %s", self.agent.rank, exc)
            return None
        if isinstance(got, CheckpointRecorded):
            return got.data
        return got.event.data if got is not None and isinstance(got.event, CheckpointRecorded) else None

    def run(self, coro, timeout: float = 10.0):
        """Run a coroutine on the bus loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)
