"""Runs admitted commands: a shutdown, a restore, a job's stop or restart, a UPS's output off,
each in its own task (the JetStream ack never waits on a 2-minute soft-off), one sequence per
node at a time; power-on commands gathered for ``gather_s`` and restored together. Each ends in
the ledger through the reporter; a sequence that dies is reported, never silent."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any

from opentelemetry import trace

from powerguard.schemas import (
    Envelope,
    JobData,
    JobRestarted,
    JobRestartRequested,
    JobStopped,
    PowerOnRequested,
    ShutdownRequested,
    UpsOutputOffRequested,
)

from .config import PowerControlSettings
from .drivers import Devices
from .readback import ReadBack
from .report import Reporter
from .sequences import Order, Sequencer
from .ups_output import UpsOutputs, tell_ups, ups_result

log = logging.getLogger("powerguard.power_control.service")


class Executor:
    def __init__(
        self,
        seq: Sequencer,
        dry: Sequencer,
        report: Reporter,
        settings: PowerControlSettings,
        *,
        devices: Devices,
        ups: UpsOutputs,
        nodes: set[str],
        readback: ReadBack,
    ) -> None:
        self.seq, self.dry, self.report, self.settings = seq, dry, report, settings
        self.devices, self.ups, self.nodes, self.readback = devices, ups, nodes, readback
        self.locks: dict[str, asyncio.Lock] = {}  # one sequence per node at a time
        self._tasks: set[asyncio.Task] = set()
        self._pending_on: list[tuple[Order, Any]] = []
        self._restorer: asyncio.Task | None = None
        self._tracer = trace.get_tracer("powerguard.power_control")

    def busy(self) -> set[str]:
        """The nodes a sequence is acting on now."""
        return {n for n, lock in self.locks.items() if lock.locked()}

    async def idle(self) -> None:
        """Wait until every started sequence has finished (tests, drills)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def stop(self, grace_s: float) -> None:
        live = [t for t in self._tasks if not t.done()]
        if live:
            _, pending = await asyncio.wait(live, timeout=grace_s)
            for t in pending:  # still running in the ledger: the next start resumes them
                t.cancel()

    def run(self, event: Envelope, key: str) -> None:
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

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.create_task(coro)  # copies the context: spans and events stay in the outage trace
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _seq(self, order: Order) -> Sequencer:
        return self.dry if order.dry_run else self.seq

    def _lock(self, node: str) -> asyncio.Lock:
        return self.locks.setdefault(node, asyncio.Lock())

    async def _ups_off(self, d, key: str) -> None:
        """Tell the UPS to cut its output after the delay and return with mains; report what it said."""
        started = time.monotonic()
        with self._tracer.start_as_current_span(
            f"ups_off {d.ups}", attributes={"powerguard.saga_id": d.saga_id, "powerguard.ups": d.ups}
        ) as span:
            ok, text = await tell_ups(d, self.ups, self.devices, nodes=self.nodes, dry_run=self.settings.dry_run)
            span.set_attribute("powerguard.ok", ok)
            kw = {"detail": text} if ok else {"error": text}
            await self.report.emit(ups_result(d, ok=ok, started=started, dry_run=self.settings.dry_run, **kw))
            await self.report.finish(key, ok, text)

    async def _shutdown(self, order: Order) -> None:
        async with self._lock(order.node):  # a power-on of this node waits for the shutdown to end
            with self._tracer.start_as_current_span(f"shutdown {order.node}", attributes=_attrs(order)) as span:
                try:
                    ok = await self._seq(order).shutdown(order)
                except Exception as exc:  # a secret, the broker, a bug: the shutdown ends reported, never silent
                    ok = False
                    await self.report.failure(order, "off", exc)
                span.set_attribute("powerguard.ok", ok)
            await self.report.finish(order.key, ok)

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
                    await self.report.failure(o, "on", exc)
            try:
                result = await self._seq(orders[0]).restore(known, issued=issued) if known else {}
            except Exception as exc:
                result = {}
                for o in known:
                    await self.report.failure(o, "on", exc)
        for o in orders:
            await self.report.finish(o.key, result.get(o.node, False))

    async def _job(self, order: Order, *, start: bool, nodes: Sequence[str]) -> None:
        name = f"job_{'restart' if start else 'stop'} {order.jobs[0]}"
        with self._tracer.start_as_current_span(name, attributes=_attrs(order)):
            try:
                ok = await self._seq(order).job(order, start=start, nodes=nodes)
            except Exception as exc:
                ok = False
                await self.report.failure(order, "job_start" if start else "job_stop", exc)
            if ok:
                kind = JobRestarted if start else JobStopped
                data = JobData(
                    job=order.jobs[0],
                    saga_id=order.saga_id,
                    nodes=list(nodes),
                    idempotency_key=order.key,
                    dry_run=order.dry_run,
                )
                await self.report.emit(kind(data=data))
        await self.report.finish(order.key, ok)


def _attrs(order: Order) -> dict[str, Any]:
    return {"powerguard.saga_id": order.saga_id, "powerguard.node": order.node, "powerguard.idempotency_key": order.key}
