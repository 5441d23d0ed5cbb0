"""The runner of the shutdown and restore plans (plans.py), independent of the bus: every step
is reported through ``emit`` as ``power.action_done`` / ``power.action_failed`` /
``node.state``. Every wait has the plan's bound; every device call a timeout (drivers/base.py).
Restore: outlets on one at a time ``outlet_stagger_s`` apart (inrush), power-ons in the ramp's
slots and a window of ``max_parallel_power_on``, then readiness (BMC on, and the probe)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from opentelemetry import trace

from powerguard.schemas import (
    Envelope,
    NodeState,
    NodeStateData,
    PowerActionDone,
    PowerActionFailed,
    PowerResultData,
)

from . import metrics
from .config import PowerControlSettings
from .drivers import Devices, PowerDriver, PowerState
from .errors import AuthenticationFailed, CredentialsDoubted, PowerControlError, PowerStateTimeout, SchedulerError
from .plans import Step, restore_plan, shutdown_plan
from .probes import probe_once
from .ramp import Ramp
from .ramp_wait import RampSignal, RampSlot
from .retry_policy import after_failure
from .schedulers import Scheduler

log = logging.getLogger(__name__)
Emit = Callable[[Envelope], Awaitable[Any]]
T = TypeVar("T")


@dataclass(frozen=True)
class Order:
    """One command as the sequences see it."""

    saga_id: str
    node: str
    key: str
    jobs: tuple[str, ...] = ()
    dry_run: bool = False
    retry: int = 0  # a shutdown commanded again after its off failed: outlets as the fallback


SETUP_CONCURRENCY = 64
CONFIRM_REFUSAL_S = 1.0  # a refused credential is tried again on a fresh session this soon (retry_policy.py)


@dataclass
class _OffRun:
    """What a shutdown's steps found so far: which of the plan's steps still apply."""

    power: str | None = None  # what the BMC last read
    bmc_failed: bool = False
    soft_error: str | None = None
    outlets_off: bool = False

    def applies(self, step: Step) -> bool:
        if step.when in ("on", "still_on"):  # the BMC read it on (or anything but off), and it still is
            return self.power != "off" and not self.bmc_failed
        if step.when == "bmc_failed":
            return self.bmc_failed
        if step.action == "outlet_off":  # after the BMC: not again when they were its fallback
            return not self.bmc_failed
        return not (self.bmc_failed and step.action in ("status", "soft_off", "off"))


class Sequencer:
    def __init__(
        self,
        devices: Devices,
        scheduler: Scheduler,
        settings: PowerControlSettings,
        emit: Emit,
        job_stopped: Callable[[str, str], Awaitable[bool]] | None = None,
    ) -> None:
        self.devices = devices
        self.scheduler = scheduler
        self.s = settings
        self.emit = emit
        self.job_stopped = job_stopped  # (saga, job) -> whether the saga's own stop of the job ran
        self._outlet_lock = asyncio.Lock()
        self._last_outlet_on = -1e9
        self.ramp = Ramp(settings.ramp)
        self._ramp_signal = RampSignal()
        # a restore's per-node setup (state reads, the ramp reservation and its report) runs at
        # most this many nodes at a time: 10,000 nodes set up at once flooded the event loop the
        # ramp's starts run on, and held the ramp up 8 s
        self._setup = asyncio.Semaphore(SETUP_CONCURRENCY)
        # at most max_parallel_power_on nodes between their power-on command and "on" (the
        # inrush), across every restore this sequencer runs: commands that arrive apart are
        # restored in separate batches, and a window per batch let a later batch's nodes start
        # beside an earlier batch's still booting
        self._window = asyncio.Semaphore(settings.max_parallel_power_on)

    # -------------------------------------------------------------- reporting
    async def _done(self, o: Order, action: str, device: str | None, started: float, **kw: Any) -> None:
        await self.emit(PowerActionDone(data=self._result(o, action, device, started, **kw)))

    async def _failed(self, o: Order, action: str, device: str | None, started: float, error: str, **kw: Any) -> None:
        log.warning("%s %s on %s failed: %s", o.key, action, o.node, error)
        await self.emit(PowerActionFailed(data=self._result(o, action, device, started, error=error, **kw)))

    def _result(self, o: Order, action: str, device: str | None, started: float, **kw: Any) -> PowerResultData:
        return PowerResultData(
            saga_id=o.saga_id,
            node=o.node,
            action=action,
            idempotency_key=o.key,
            device=device,
            duration_s=round(max(0.0, time.monotonic() - started), 3),
            dry_run=o.dry_run or self.devices.dry_run,
            **kw,
        )

    async def _node_state(self, o: Order, state: str, detail: str | None = None) -> None:
        await self.emit(NodeState(data=NodeStateData(node=o.node, state=state, saga_id=o.saga_id, detail=detail)))

    # -------------------------------------------------------------- helpers
    async def _retrying(self, what: str, fn: Callable[[], Awaitable[T]]) -> T:
        attempt = 0
        while True:
            try:
                return await fn()
            except PowerControlError as exc:
                retry = after_failure(
                    exc,
                    attempt,
                    retries=self.s.retries,
                    backoff_s=self.s.retry_backoff_s,
                    confirm_s=CONFIRM_REFUSAL_S,
                )
                if not retry.again:
                    raise
                attempt += 1
                log.info("%s failed (%s); retry %d/%d in %.1fs", what, exc, attempt, self.s.retries, retry.delay_s)
                await asyncio.sleep(retry.delay_s)

    async def _wait_state(self, bmc: PowerDriver, want: PowerState, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if await bmc.status() == want:
                    return True
            except PowerControlError as exc:
                if not exc.retryable:
                    raise
                log.debug("%s: status read failed while waiting for %s: %s", bmc.device, want, exc)
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            await asyncio.sleep(min(self.s.poll_interval_s, left))

    # -------------------------------------------------------------- shutdown
    async def shutdown(self, o: Order) -> bool:
        """Run the node's shutdown plan (plans.shutdown_plan); True when the node ended off (or
        has no BMC and its jobs were stopped)."""
        started = time.monotonic()
        bmc = self.devices.bmc(o.node)
        plan = shutdown_plan(
            self.devices.node(o.node),
            self.s,
            now=started,
            jobs=o.jobs,
            retry=o.retry,
            bmc=bmc.device if bmc is not None else None,
            scheduler=self.scheduler.kind,
        )
        await self._node_state(o, "shutting_down")
        run = _OffRun()
        for step in plan.steps:
            if not run.applies(step):
                continue
            if step.action == "job_stop":
                await self._stop_jobs(o)
            elif step.action == "outlet_off":
                if not await self._outlet(o, self._ref(o.node, step.device), on=False):
                    return False
                run.outlets_off = True
            else:
                await self._bmc_step(o, bmc, step, run)
                if run.bmc_failed and not (o.retry and self.devices.node(o.node).outlets):
                    return False
        took = time.monotonic() - started
        detail = f"outlets off after the BMC failed ({took:.1f}s)" if run.bmc_failed else f"off after {took:.1f}s"
        await self._node_state(o, "off", detail)
        return True

    async def _stop_jobs(self, o: Order) -> None:
        t = time.monotonic()
        try:
            jobs = list(o.jobs)
            if self.job_stopped is not None and jobs:  # a job is stopped once: by its own command
                ran = await asyncio.gather(*(self.job_stopped(o.saga_id, j) for j in jobs))
                jobs = [j for j, stopped in zip(jobs, ran, strict=True) if not stopped]
            detail = await self.scheduler.prepare_shutdown(o.node, saga_id=o.saga_id, jobs=jobs)
            await self._done(o, "job_stop", f"scheduler:{self.scheduler.kind}", t, detail=detail)
        except SchedulerError as exc:  # power still has to go down: the checkpoint is already durable
            await self._failed(o, "job_stop", f"scheduler:{self.scheduler.kind}", t, str(exc))

    async def _bmc_step(self, o: Order, bmc: PowerDriver, step: Step, run: _OffRun) -> None:
        """One BMC step of the plan (read, soft-off and wait, hard off and wait); what it found
        goes into ``run``. A device error ends the BMC's part reported (``action_failed``)."""
        t = time.monotonic()
        try:
            if step.action == "status":
                run.power = await self._retrying(f"{bmc.device} status", bmc.status)
                if run.power == "off":
                    await self._done(o, "off", bmc.device, t, power_state="off", detail="already off")
            elif step.action == "soft_off":
                try:
                    await self._retrying(f"{bmc.device} soft-off", bmc.soft_off)
                    await self._done(o, "soft_off", bmc.device, t, detail="ACPI shutdown requested")
                    if await self._wait_state(bmc, "off", step.wait_s):
                        run.power = "off"
                        await self._done(o, "off", bmc.device, t, power_state="off", detail="soft-off completed")
                except PowerControlError as exc:
                    if not exc.retryable:
                        raise
                    run.soft_error = str(exc)
            else:  # "off": the hard off of a node still on
                await self._retrying(f"{bmc.device} power off", bmc.off)
                if not await self._wait_state(bmc, "off", step.wait_s):
                    raise PowerStateTimeout(f"{bmc.device}: still on {step.wait_s:.0f}s after a hard power off")
                run.power = "off"
                why = (
                    f"soft-off failed ({run.soft_error})"
                    if run.soft_error
                    else f"still on after {self.s.soft_off_timeout_s:.0f}s"
                )
                await self._done(o, "off", bmc.device, t, power_state="off", detail=f"hard off: {why}")
        except PowerControlError as exc:
            await self._failed(o, "off", bmc.device, t, str(exc), power_state="unknown")
            run.bmc_failed = True
            if o.retry and self.devices.node(o.node).outlets:
                log.warning("%s: the BMC failed again on a retry of its off: switching its outlets off", o.node)

    def _ref(self, node: str, device: str):
        return next(r for r in self.devices.node(node).outlets if f"pdu:{r.pdu}:{r.outlet}" == device)

    async def _outlets(self, o: Order, *, on: bool, slot: RampSlot | None = None) -> bool:
        """Switch the node's outlets in order; with a ramp ``slot``, the first switch waits for it."""
        for ref in self.devices.node(o.node).outlets:
            if not await self._outlet(o, ref, on=on, slot=slot):
                return False
            slot = None
        return True

    async def _outlet(self, o: Order, ref, *, on: bool, slot: RampSlot | None = None) -> bool:
        """Switch one outlet (the ramp ``slot`` first, when given) and read it back."""
        action = "outlet_on" if on else "outlet_off"
        t = time.monotonic()
        device = f"pdu:{ref.pdu}:{ref.outlet}"
        try:
            pdu = self.devices.pdu(ref.pdu)
            if await self._retrying(f"{device} state", lambda: pdu.outlet_state(ref.outlet)) == ("on" if on else "off"):
                await self._done(o, action, device, t, detail="already " + ("on" if on else "off"))
                return True
            if on:
                if slot is not None:
                    await slot.wait()
                await self._stagger()
                t = time.monotonic()
            await self._retrying(f"{device} switch", lambda: pdu.set_outlet(ref.outlet, on))
            state = await pdu.outlet_state(ref.outlet)
            if state != ("on" if on else "off"):
                raise PowerStateTimeout(f"{device}: reads {state} after switching it {'on' if on else 'off'}")
            await self._done(o, action, device, t, detail=f"outlet {state}")
        except PowerControlError as exc:
            await self._failed(o, action, device, t, str(exc))
            return False
        return True

    async def _stagger(self) -> None:
        """Outlet-on actions of the whole site are at least ``outlet_stagger_s`` apart."""
        async with self._outlet_lock:
            wait = self._last_outlet_on + self.s.outlet_stagger_s - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            self._last_outlet_on = time.monotonic()

    # -------------------------------------------------------------- restore
    async def restore(self, orders: Sequence[Order], *, issued: asyncio.Event | None = None) -> dict[str, bool]:
        """Power nodes on in group order; True per node that ended ready. ``issued`` is set once
        the last group's power-ons have been sent (its nodes' readiness still to come), or with a
        ramp once they are queued in it (the ramp spaces them and the next restore's nodes)."""
        result: dict[str, bool] = {}
        by_node: dict[str, list[Order]] = {}
        for o in orders:
            by_node.setdefault(o.node, []).append(o)
        plan = restore_plan(
            list(by_node),
            {n: self.devices.node(n) for n in by_node},
            self.s,
            now=time.monotonic(),
            bmcs={n for n in by_node if self.devices.bmc(n) is not None},
        )
        last = plan.groups[-1].group if plan.groups else None
        for step in plan.groups:
            group, members = step.group, [o for n in step.nodes for o in by_node[n.node]]
            switch = {n.node: n.switch for n in step.nodes}
            log.info("restore: power-on group %d: %s", group, ", ".join(o.node for o in members))
            started = {o.node: time.monotonic() for o in members}
            powered: list[Order] = []

            async def outlets_on(o: Order, switch: dict[str, str] = switch) -> bool:
                if switch[o.node] == "outlet":  # its outlet is its power switch: the ramp gates it
                    return await self._ramp_wait(o, lambda slot: self._outlets(o, on=True, slot=slot))
                async with self._setup:  # standby power only: not in the ramp
                    return await self._outlets(o, on=True)

            # all members at once (the stagger and the ramp space the switching themselves): one
            # after the other, 1,500 nodes' outlet reads and reports held the ramp up ~1.5 s
            for o, ok in zip(members, await asyncio.gather(*map(outlets_on, members)), strict=True):
                if ok:
                    powered.append(o)
                else:
                    result[o.node] = False
            # the sequencer's power-on window: a node takes its place only once its BMC answered, so
            # a dead BMC (its status read retried for a minute) never holds up the others, as fixed
            # batches did
            readiness: dict[str, asyncio.Task] = {}  # each node's readiness runs from the moment it is on
            running = asyncio.gather(*(self._power_on(o, started[o.node], readiness) for o in powered))
            if group == last and issued is not None and self.s.ramp.enabled:
                await asyncio.sleep(0)  # every power-on has its place in the ramp: the next restore may set up
                issued.set()
            oks = await running
            result.update({o.node: False for o, ok in zip(powered, oks, strict=True) if not ok})
            if group == last and issued is not None:
                issued.set()  # without a ramp (or nothing powered): once the last group's power-ons ran
            for node, task in readiness.items():
                result[node] = await task
        return result

    async def _ramp_wait(self, o: Order, until: Callable[[RampSlot], Awaitable[T]]) -> T:
        """Take this node's slot in the power-on ramp and run ``until(slot)``, which returns
        once the node has started (a BMC driver's ``on_at`` sets its session
        up before the slot, then sends at it). No ramp configured: the slot is now."""
        if not self.s.ramp.enabled:
            return await until(RampSlot(None, o.node, (), time.monotonic(), self._ramp_signal))
        pdus = tuple(out.pdu for out in self.devices.node(o.node).outlets)
        metrics.RAMP_QUEUED.inc()
        try:
            async with self._setup:
                now = time.monotonic()
                slot = RampSlot(self.ramp, o.node, pdus, self.ramp.reserve(o.node, pdus, now), self._ramp_signal)
                wait = slot.start - now
                if wait > 0.05:
                    await self._node_state(o, "off", f"power-on ramp: starts in {wait:.1f}s")
            with trace.get_tracer("powerguard.power_control").start_as_current_span(
                f"ramp {o.node}", attributes={"powerguard.node": o.node, "powerguard.ramp_wait_s": round(wait, 3)}
            ):
                try:
                    return await until(slot)
                finally:
                    slot.done()
        finally:
            metrics.RAMP_QUEUED.dec()

    async def _power_on(self, o: Order, started: float, readiness: dict[str, asyncio.Task]) -> bool:
        """Power the node on; once it is on, its readiness check starts (a task in ``readiness``)."""
        if await self._switch_on(o, started):
            readiness[o.node] = asyncio.create_task(self._ready(o, started))
            return True
        return False

    async def _switch_on(self, o: Order, started: float) -> bool:
        bmc = self.devices.bmc(o.node)
        if bmc is None:
            return True  # the outlet was the power switch (its outlet-on waited for the ramp)
        t = time.monotonic()
        try:
            async with self._setup:
                state = await self._retrying(f"{bmc.device} status", bmc.status)
            if state == "on":
                await self._done(o, "on", bmc.device, t, power_state="on", detail="already on")
                return True
            async with self._window:
                # the ramp's slot is when the BMC gets the command (a retry goes at once: its slot passed)
                unclear = await self._command_on(o, bmc)
                await self._node_state(o, "booting")
                left = self.s.boot_timeout_s - (time.monotonic() - started)
                if not await self._wait_state(bmc, "on", max(left, self.s.poll_interval_s)):
                    raise PowerStateTimeout(f"{bmc.device}: not on {self.s.boot_timeout_s:.0f}s after power-on")
                detail = f"on, although its power-on answer was: {unclear}" if unclear else None
                await self._done(o, "on", bmc.device, t, power_state="on", detail=detail)
                if self.s.batch_interval_s:
                    await asyncio.sleep(self.s.batch_interval_s)  # the place is free this long after "on"
            return True
        except PowerControlError as exc:
            await self._failed(o, "on", bmc.device, t, str(exc), power_state="unknown")
            return False

    async def _command_on(self, o: Order, bmc: PowerDriver) -> str | None:
        """Send the power-on (in the ramp's slot); None, or the error of a command that may have
        reached the BMC all the same (an answer lost or garbled): the node keeps its place in the
        window while a read of its power state decides, since its inrush may still come. A
        refused credential never reached it."""
        try:
            # the ramp's slot is when the BMC gets the command (a retry goes at once: its slot passed)
            await self._ramp_wait(o, lambda slot: self._retrying(f"{bmc.device} power on", lambda: bmc.on_at(slot)))
            return None
        except PowerControlError as exc:
            refused = isinstance(exc, AuthenticationFailed | CredentialsDoubted)
            if refused or not await self._wait_state(bmc, "on", self.s.device_timeout_s):
                raise
            log.warning("%s: on after a power-on that failed (%s)", o.node, exc)
            return str(exc)

    async def _ready(self, o: Order, started: float) -> bool:
        probe = self.s.probes.get(o.node)
        if probe is not None and not (o.dry_run or self.devices.dry_run):
            deadline = started + self.s.boot_timeout_s
            last = ""
            while True:
                ok, last = await probe_once(probe.url, timeout_s=min(self.s.device_timeout_s, 5.0))
                if ok:
                    break
                if time.monotonic() + probe.interval_s > deadline:
                    await self._failed(
                        o,
                        "on",
                        f"probe:{probe.url}",
                        started,
                        f"node {o.node} not ready within {self.s.boot_timeout_s:.0f}s: {last}",
                        power_state="on",
                    )
                    return False
                await asyncio.sleep(probe.interval_s)
        try:
            await self.scheduler.node_restored(o.node, saga_id=o.saga_id)
        except SchedulerError as exc:
            await self._failed(o, "job_start", f"scheduler:{self.scheduler.kind}", started, str(exc))
        await self._node_state(o, "ready", f"ready {time.monotonic() - started:.1f}s after power-on began")
        return True

    # -------------------------------------------------------------- jobs
    async def job(self, o: Order, *, start: bool, nodes: Sequence[str]) -> bool:
        action = "job_start" if start else "job_stop"
        t = time.monotonic()
        job = o.jobs[0]
        try:
            fn = self.scheduler.start_job if start else self.scheduler.stop_job
            detail = await fn(job, nodes=nodes, saga_id=o.saga_id)
            await self._done(o, action, f"scheduler:{self.scheduler.kind}", t, detail=detail)
            return True
        except SchedulerError as exc:
            await self._failed(o, action, f"scheduler:{self.scheduler.kind}", t, str(exc))
            return False
