"""The power-control service: executes the coordinator's commands on BMCs, PDUs and the
scheduler, exactly once per idempotency key, and reports every step.

The command handler only claims the key in the ``pg_power`` ledger and starts the sequence
in a task, so the JetStream ack never waits on a 2-minute soft-off. Power-on commands are
gathered for ``gather_s`` and sequenced together (groups, outlet stagger, batches).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Sequence
from typing import Any

from opentelemetry import trace

from powerguard.bus import Bus, ReadError, ReadyLog, ServiceContext
from powerguard.bus.roles import durable_filters, durable_names
from powerguard.schemas import (
    ConfigError,
    Envelope,
    JobData,
    JobRestarted,
    JobRestartRequested,
    JobStopped,
    JobStopRequested,
    NodeState,
    NodeStateData,
    PowerActionDone,
    PowerActionFailed,
    PowerOnRequested,
    PowerResultData,
    SagaStateChanged,
    ShutdownRequested,
    SiteConfig,
    UpsOutputOffRequested,
    command_key,
    decode,
)

from . import device_health, metrics
from .admission import NO_SAGA, may_be_stale, refusal
from .config import PowerControlSettings
from .drivers import Devices
from .errors import PowerControlError
from .ledger import Ledger
from .probes import probe_once
from .readback import ReadBack
from .readback import meaning as readback_meaning
from .schedulers import make_scheduler
from .schedulers.base import DryRunScheduler
from .sequences import Order, Sequencer
from .ups_output import UpsOutputs, tell_ups, ups_result

log = logging.getLogger(__name__)
COMMANDS = (ShutdownRequested, PowerOnRequested, JobStopRequested, JobRestartRequested, UpsOutputOffRequested)


def load_settings(site: SiteConfig) -> PowerControlSettings:
    return site.settings("power_control", PowerControlSettings)


class PowerControl:
    def __init__(
        self,
        bus: Bus,
        site: SiteConfig,
        settings: PowerControlSettings | None = None,
        *,
        instance: str = "power-control",
    ) -> None:
        self.bus = bus
        self.site = site
        self.settings = settings or load_settings(site)
        self.instance = instance
        self.devices = Devices(site, self.settings)
        # the device checks' own drivers and slots: a check waiting on a dead BMC never holds a
        # slot a power action needs (the checks run every device_check_s, outages or not)
        self.checked_devices = Devices(site, self.settings)
        self.scheduler = make_scheduler(self.settings.scheduler)
        self.seq = Sequencer(self.devices, self.scheduler, self.settings, self._emit, self._job_stopped)
        dry_jobs = DryRunScheduler(self.scheduler.kind)  # a drill names the adapter the site runs
        self.dry = Sequencer(Devices(site, self.settings, dry_run=True), dry_jobs, self.settings, self._emit)
        self.executed: list[str] = []  # idempotency keys this process executed, in order
        self._nodes = {n.name for n in site.nodes}
        self.ups_outputs = UpsOutputs(site, timeout_s=max(self.settings.device_timeout_s, 30.0))
        self._node_locks: dict[str, asyncio.Lock] = {}  # one sequence per node at a time
        self._tasks: set[asyncio.Task] = set()
        self._pending_on: list[tuple[Order, Any]] = []
        self._restorer: asyncio.Task | None = None
        self._consumer: Any = None
        self._ledger: Ledger | None = None
        self.readback = ReadBack(interval_s=self.settings.readback_s, window_s=self.settings.readback_window_s)
        self._reader: asyncio.Task | None = None
        self._tracer = trace.get_tracer("powerguard.power_control")

    async def _emit(self, event: Envelope) -> None:
        d = event.data
        if isinstance(event, PowerActionDone | PowerActionFailed) and not d.dry_run:
            metrics.ACTIONS.labels(d.action, "done" if isinstance(event, PowerActionDone) else "failed").inc()
            if isinstance(event, PowerActionFailed) and d.action in ("on", "outlet_on"):
                metrics.NODE_READY.labels(d.node).set(0)
                metrics.RESTORE_FAILED.labels(d.node).inc()
        if isinstance(event, NodeState) and d.state in ("ready", "off") and not self.settings.dry_run:
            metrics.NODE_READY.labels(d.node).set(1 if d.state == "ready" else 0)
        if isinstance(event, NodeState):
            self.readback.reported(d.node, d.state)
        await self.bus.publish(event)

    # -------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        self._ledger = Ledger(await self.bus.power_actions(), self.instance)
        for entry in await self._ledger.unfinished():
            try:
                event = decode(json.dumps(entry.event))
            except Exception as exc:  # a ledger entry we cannot read must not stop the service
                log.error("ledger entry %s unreadable (%s); marked failed", entry.key, exc)
                await self._ledger.finish(entry.key, "failed", f"unreadable: {exc}")
                continue
            why = await self._refusal(event)  # too old, or its saga moved on (restoring the node)
            if why is not None:
                log.warning("not resuming %s left running by a previous power-control: %s", entry.key, why)
                await self._ledger.finish(entry.key, "failed", f"not resumed: {why}")
                continue
            log.info("resuming %s left running by a previous power-control", entry.key)
            self._run(event, entry.key)
        self._reader = asyncio.create_task(self._read_back_loop())
        durable = durable_names(self.site.site)["power-control"]
        self._consumer = await self.bus.consume(
            *COMMANDS,
            handler=self.on_command,
            durable=durable,
            subject=durable_filters(self.bus.names, self.site.site)[durable],
            since_s=self.settings.max_command_age_s,
        )

    async def stop(self, grace_s: float = 5.0) -> None:
        if self._reader is not None:
            self._reader.cancel()
        if self._consumer is not None:
            await self._consumer.stop()
        live = [t for t in self._tasks if not t.done()]
        if live:
            _, pending = await asyncio.wait(live, timeout=grace_s)
            for t in pending:  # still running in the ledger: the next start resumes them
                t.cancel()
        await self.devices.close()
        await self.checked_devices.close()
        await self.scheduler.close()

    async def check_devices(self) -> device_health.DeviceHealth:
        """Can every node be acted on now (its BMC and outlets answer)? With the checks' own
        drivers: a power action never waits for a check."""
        nodes = [n.name for n in self.site.nodes]
        return await device_health.check(self.checked_devices, self.site.site, nodes, self.settings.device_timeout_s)

    async def idle(self) -> None:
        """Wait until every started sequence has finished (tests, drills)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    # -------------------------------------------------------------- commands
    async def on_command(self, event: Envelope) -> None:
        d = event.data
        if isinstance(event, JobStopRequested | JobRestartRequested) and d.saga_id is None:
            log.info("ignoring %s for job %s without a saga id", event.short_type, d.job)
            return
        why = await self._refusal(event)
        if why is not None:
            await self._refuse(event, why)
            return
        key = d.idempotency_key or f"{event.type}/{event.id}"
        assert self._ledger is not None
        if await self._ledger.claim(key, event.model_dump(mode="json")) is None:
            seen = await self._ledger.get(key) or {}
            log.info("duplicate command %s (%s): nothing new done", key, seen.get("status", "?"))
            return
        self._run(event, key)

    async def _refusal(self, event: Envelope) -> str | None:
        """Why this command must not run (None: run it): admission.py's rule over the state
        its saga was last announced in (a direct get of the newest ``pg.saga.<id>`` event).

        In a cluster the read may be answered by a replica a moment behind the leader: an
        older state, or none yet, for a command the coordinator sent after announcing its
        state. So a refusal that such a lag can explain (:func:`.admission.may_be_stale`) is
        read again (:data:`REREAD_S`) before it stands, and a read that keeps failing raises
        (the command is delivered again): "not read" is never taken for "never announced".
        Any other refusal stands at once (it never holds the consumer)."""
        if why := self._admit(event, None):  # too old, not in the site file: no read changes that
            return why
        if not self.settings.require_saga:
            return None
        saga_id = event.data.saga_id
        if not saga_id:
            return self._admit(event, NO_SAGA)
        subject = self.bus.subjects.saga(saga_id)
        why, failure = None, None
        for pause in (*REREAD_S, None):
            try:
                got = await self.bus.last(subject, strict=True)
                failure = None
            except ReadError as exc:
                failure = exc
            else:
                ok = got is not None and isinstance(got.event, SagaStateChanged) and got.event.data.saga_id == saga_id
                state = got.event.data.state if ok else NO_SAGA
                why = self._admit(event, state)
                if why is None or not may_be_stale(event, state):
                    return why
            if pause is not None:
                await asyncio.sleep(pause)
        if failure is not None:
            raise failure
        return why

    def _admit(self, event: Envelope, saga: str | None) -> str | None:
        return refusal(
            event,
            now=time.time(),
            max_age_s=self.settings.max_command_age_s,
            nodes=self._nodes,
            ups=self.ups_outputs,
            saga=saga,
        )

    async def _refuse(self, event: Envelope, why: str) -> None:
        d = event.data
        metrics.REFUSED.labels(event.short_type).inc()
        log.error("refused %s %s: %s", event.short_type, event.id, why)
        if isinstance(event, UpsOutputOffRequested):
            await self._emit(
                ups_result(
                    d, ok=False, error=f"refused: {why}", started=time.monotonic(), dry_run=self.settings.dry_run
                )
            )
            return
        if isinstance(event, ShutdownRequested | PowerOnRequested):
            node, action = d.node, "off" if isinstance(event, ShutdownRequested) else "on"
        else:
            node = d.nodes[0] if d.nodes else d.job
            action = "job_start" if isinstance(event, JobRestartRequested) else "job_stop"
        await self._emit(
            PowerActionFailed(
                data=PowerResultData(
                    saga_id=d.saga_id,
                    node=node,
                    action=action,
                    idempotency_key=d.idempotency_key,
                    error=f"refused: {why}",
                    dry_run=d.dry_run,
                )
            )
        )

    # -------------------------------------------------------------- read-back
    async def _read_back_loop(self) -> None:
        """Read back, every ``readback_s``, each node whose last command has not reached its
        result; each node on its own (a dead BMC never delays another's read)."""
        while True:
            await asyncio.sleep(min(1.0, self.settings.readback_s))
            busy = {n for n, lock in self._node_locks.items() if lock.locked()}
            due = self.readback.due(time.monotonic(), busy)
            if due:
                await asyncio.gather(*(self._read_back(node, exp) for node, exp in due), return_exceptions=True)

    async def _read_back(self, node: str, exp) -> None:
        bmc = None if self.settings.dry_run else self.devices.bmc(node)
        if bmc is None:
            return
        try:
            power = await bmc.status()
        except PowerControlError as exc:
            log.debug("read-back of %s: %s", node, exc)
            return
        probe_ok = None
        probe = self.settings.probes.get(node)
        if probe is not None and power == "on":
            probe_ok, _ = await probe_once(probe.url, timeout_s=min(self.settings.device_timeout_s, 5.0))
        state = readback_meaning(exp.want, power, probe_ok)
        if state is not None:
            log.info("read-back: %s is %s (saga %s was waiting for it)", node, state, exp.saga_id)
            await self._emit(
                NodeState(
                    data=NodeStateData(node=node, state=state, saga_id=exp.saga_id, detail="read back by power-control")
                )
            )

    def _run(self, event: Envelope, key: str) -> None:
        d = event.data
        if isinstance(event, UpsOutputOffRequested):
            self._spawn(self._ups_off(d, key))
            return
        if isinstance(event, ShutdownRequested | PowerOnRequested) and d.saga_id and not d.dry_run:
            want = "off" if isinstance(event, ShutdownRequested) else "ready"
            self.readback.expect(d.node, d.saga_id, want, time.monotonic())
        if isinstance(event, PowerOnRequested):
            order = Order(saga_id=d.saga_id, node=d.node, key=key, dry_run=d.dry_run)
            self._pending_on.append((order, trace.get_current_span().get_span_context()))
            if self._restorer is None or self._restorer.done():
                self._restorer = self._spawn(self._restore_loop())
            return
        if isinstance(event, ShutdownRequested):
            order = Order(saga_id=d.saga_id, node=d.node, key=key, jobs=tuple(d.jobs), dry_run=d.dry_run, retry=d.retry)
            self._spawn(self._shutdown(order))
            return
        order = Order(saga_id=d.saga_id or "", node=(d.nodes or ["-"])[0], key=key, jobs=(d.job,), dry_run=d.dry_run)
        self._spawn(self._job(order, start=isinstance(event, JobRestartRequested), nodes=d.nodes))

    async def _ups_off(self, d, key: str) -> None:
        """Tell the UPS to cut its output after the delay and return with mains; report what it said."""
        started = time.monotonic()
        with self._tracer.start_as_current_span(
            f"ups_off {d.ups}", attributes={"powerguard.saga_id": d.saga_id, "powerguard.ups": d.ups}
        ) as span:
            ok, text = await tell_ups(
                d, self.ups_outputs, self.devices, nodes=self._nodes, dry_run=self.settings.dry_run
            )
            span.set_attribute("powerguard.ok", ok)
            kw = {"detail": text} if ok else {"error": text}
            await self._emit(ups_result(d, ok=ok, started=started, dry_run=self.settings.dry_run, **kw))
            await self._finish(key, ok, text)

    async def _job_stopped(self, saga_id: str, job: str) -> bool:
        """Whether the saga's own stop of ``job`` ran (the ledger's answer, waited for)."""
        if self._ledger is None:
            return False
        return await self._ledger.ran(
            command_key(saga_id, job, "stop"),
            grace_s=self.settings.job_stop_grace_s,
            wait_s=self.settings.job_stop_wait_s,
        )

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.create_task(coro)  # copies the context: spans and events stay in the outage trace
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _seq(self, order: Order) -> Sequencer:
        return self.dry if order.dry_run else self.seq

    async def _finish(self, key: str, ok: bool, detail: str | None = None) -> None:
        """The ledger entry ends (done or failed), retried through a broker outage: an entry
        left 'running' would be resumed at the next start."""
        self.executed.append(key)
        assert self._ledger is not None
        for attempt in range(6):
            try:
                await self._ledger.finish(key, "done" if ok else "failed", detail or "")
                return
            except Exception as exc:
                log.warning("ledger %s not updated (attempt %d): %s", key, attempt + 1, exc)
                await asyncio.sleep(min(2**attempt, 10))
        log.error("ledger %s left as it was after 6 attempts", key)

    async def _failure(self, order: Order, action: str, exc: BaseException) -> None:
        """A sequence died: say why on the bus (retried), so the saga reacts now, not at its timeout."""
        why = f"{type(exc).__name__}: {exc}"[:500]
        log.error("%s of %s failed: %s", action, order.node, why, exc_info=exc)
        event = PowerActionFailed(
            data=PowerResultData(
                saga_id=order.saga_id,
                node=order.node,
                action=action,
                idempotency_key=order.key,
                error=why,
                dry_run=order.dry_run,
            )
        )
        for attempt in range(6):
            try:
                await self._emit(event)
                return
            except Exception as publish_exc:
                log.warning("action_failed for %s not published (attempt %d): %s", order.key, attempt + 1, publish_exc)
                await asyncio.sleep(min(2**attempt, 10))

    def _lock(self, node: str) -> asyncio.Lock:
        return self._node_locks.setdefault(node, asyncio.Lock())

    async def _shutdown(self, order: Order) -> None:
        async with self._lock(order.node):  # a power-on of this node waits for the shutdown to end
            await self._shutdown_locked(order)

    async def _shutdown_locked(self, order: Order) -> None:
        with self._tracer.start_as_current_span(f"shutdown {order.node}", attributes=_attrs(order)) as span:
            try:
                ok = await self._seq(order).shutdown(order)
            except Exception as exc:  # a secret, the broker, a bug: the shutdown ends reported, never silent
                ok = False
                await self._failure(order, "off", exc)
            span.set_attribute("powerguard.ok", ok)
        await self._finish(order.key, ok)

    async def _restore_loop(self) -> None:
        """Restore the commands gathered for ``gather_s``, then what came meanwhile, and so on. A
        batch starts once the one before has sent its last power-on (with a ramp: has queued it
        in the ramp), not when its nodes are ready: waiting for that left the power-on ramp idle
        between batches (12,500 nodes arriving over seconds: 12 s of a 125 s ramp)."""
        await asyncio.sleep(self.settings.gather_s)
        while self._pending_on:
            batch, self._pending_on = self._pending_on, []
            for dry in (False, True):
                orders = [(o, ctx) for o, ctx in batch if o.dry_run == dry]
                if orders:
                    issued = asyncio.Event()
                    task = self._spawn(self._restore([o for o, _ in orders], orders[0][1], issued))
                    sent = asyncio.ensure_future(issued.wait())
                    await asyncio.wait({task, sent}, return_when=asyncio.FIRST_COMPLETED)
                    sent.cancel()

    async def _restore(self, orders: Sequence[Order], parent: trace.SpanContext, issued: asyncio.Event) -> None:
        try:
            async with contextlib.AsyncExitStack() as stack:
                for node in sorted({o.node for o in orders}):  # sorted: two batches never deadlock
                    await stack.enter_async_context(self._lock(node))
                await self._restore_locked(orders, parent, issued)
        finally:
            issued.set()

    async def _restore_locked(self, orders: Sequence[Order], parent: trace.SpanContext, issued: asyncio.Event) -> None:
        ctx = trace.set_span_in_context(trace.NonRecordingSpan(parent))
        with self._tracer.start_as_current_span(
            "power_on " + ",".join(o.node for o in orders), context=ctx, attributes=_attrs(orders[0])
        ):
            known = []
            for o in orders:  # one bad order (unknown node, missing credential) never holds back the others
                try:
                    self._seq(o).devices.bmc(o.node)  # builds the driver: its credentials are read now
                    known.append(o)
                except Exception as exc:
                    await self._failure(o, "on", exc)
            try:
                result = await self._seq(orders[0]).restore(known, issued=issued) if known else {}
            except Exception as exc:
                result = {}
                for o in known:
                    await self._failure(o, "on", exc)
        for o in orders:
            await self._finish(o.key, result.get(o.node, False))

    async def _job(self, order: Order, *, start: bool, nodes: Sequence[str]) -> None:
        name = f"job_{'restart' if start else 'stop'} {order.jobs[0]}"
        with self._tracer.start_as_current_span(name, attributes=_attrs(order)):
            try:
                ok = await self._seq(order).job(order, start=start, nodes=nodes)
            except Exception as exc:
                ok = False
                await self._failure(order, "job_start" if start else "job_stop", exc)
            if ok:
                kind = JobRestarted if start else JobStopped
                data = JobData(
                    job=order.jobs[0],
                    saga_id=order.saga_id,
                    nodes=list(nodes),
                    idempotency_key=order.key,
                    dry_run=order.dry_run,
                )
                await self._emit(kind(data=data))
        await self._finish(order.key, ok)


DEGRADED_RECHECK_S = 5.0
REREAD_S = (0.1, 0.3, 0.6)  # a saga-state refusal is read again after these pauses before it stands


def _attrs(order: Order) -> dict[str, Any]:
    return {"powerguard.saga_id": order.saga_id, "powerguard.node": order.node, "powerguard.idempotency_key": order.key}


async def main(ctx: ServiceContext) -> None:
    if ctx.site is None:
        raise ConfigError("power-control needs --config site.yaml (its nodes, BMCs and PDUs)")
    service = PowerControl(ctx.bus, ctx.site, instance=getattr(ctx.args, "instance", None) or "power-control")
    if service.settings.dry_run:
        log.warning("power-control in dry-run mode: no device will be touched")
    await service.start()
    log.info(
        "power-control started: %d node(s), %d PDU(s), scheduler %s",
        len(ctx.site.nodes),
        len(ctx.site.pdus),
        service.scheduler.kind,
    )
    every = service.settings.device_check_s
    say = ReadyLog("power-control", ctx.set_ready, logger=log)
    if service.settings.dry_run or every == 0:
        say(True, "ok (dry-run: no device is checked)" if service.settings.dry_run else "ok (devices not checked)")
        await ctx.stopping.wait()
    else:
        while not ctx.stopping.is_set():
            ready, reason = (await service.check_devices()).verdict()
            say(ready, reason)
            with contextlib.suppress(TimeoutError):  # degraded: look again soon (a BMC still booting)
                await asyncio.wait_for(ctx.stopping.wait(), every if ready else min(every, DEGRADED_RECHECK_S))
    await service.stop()
