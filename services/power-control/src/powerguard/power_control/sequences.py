"""The runner of the shutdown and restore plans (plans.py): it executes the plan it is given
and reports each step against it (step_report.py); it keeps no schedule of its own.

Shutdown: the node's steps in the plan's order, each cut at the plan's deadline (a step past it
is reported failed, and the plan's fallback applies: the outlets after a BMC that failed on a
retry). Restore: group by group; each group is planned when it starts (what the runner learned
meanwhile, the ramp's live bookings and the time, are the re-plan's inputs), its nodes' ramp
slots booked as the plan gave them, outlets on ``outlet_stagger_s`` apart, power-ons in those
slots and a window of ``max_parallel_power_on``, then readiness (BMC on, and the probe); each
node's own part is cut at the plan's bound (``NodeRestore.bound_s``) from its turn. Every wait
is on the runner's clock (clock.py): the unit tests run it in virtual time."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from opentelemetry import trace

from . import clock, metrics
from .config import PowerControlSettings
from .device_steps import DeviceSteps
from .drivers import Devices, PowerDriver
from .errors import AuthenticationFailed, CredentialsDoubted, PowerControlError, PowerStateTimeout, SchedulerError
from .plans import NodeRestore, Step, restore_plan, shutdown_plan
from .probes import probe_once
from .ramp import Ramp
from .ramp_wait import RampSignal, RampSlot
from .schedulers import Scheduler
from .step_report import Emit, Order, StepReport

log = logging.getLogger(__name__)
T = TypeVar("T")
__all__ = ["Order", "Sequencer"]

SETUP_CONCURRENCY = 64


@dataclass
class _OffRun:
    """What a shutdown's steps found so far: which of the plan's steps still apply."""

    power: str | None = None  # what the BMC last read
    bmc_failed: bool = False
    soft_error: str | None = None

    def applies(self, step: Step) -> bool:
        if step.when in ("on", "still_on"):  # the BMC read it on (or anything but off), and it still is
            return self.power != "off" and not self.bmc_failed
        if step.when == "bmc_failed":
            return self.bmc_failed
        if step.action == "outlet_off":  # after the BMC: not again when they were its fallback
            return not self.bmc_failed
        return not (self.bmc_failed and step.action in ("status", "soft_off", "off"))


def _past(what: str, started: float, deadline: float) -> str:
    return f"{what}: not done by its planned deadline ({deadline - started:.1f}s after the command)"


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
        self.report = StepReport(emit, dry_run=devices.dry_run)
        self.steps = DeviceSteps(devices, settings, self.report)
        self.job_stopped = job_stopped  # (saga, job) -> whether the saga's own stop of the job ran
        self.ramp = Ramp(settings.ramp)  # the live bookings: the plans reserve on a copy, the runner books them
        self._ramp_signal = RampSignal()
        # a restore's per-node setup (state reads, the ramp reservation and its report) runs at
        # most this many nodes at a time: 10,000 nodes set up at once flooded the event loop the
        # ramp's starts run on, and held the ramp up 8 s
        self._setup = asyncio.Semaphore(SETUP_CONCURRENCY)
        # at most max_parallel_power_on nodes between their power-on command and "on" (the
        # inrush), across every restore this sequencer runs
        self._window = asyncio.Semaphore(settings.max_parallel_power_on)

    # -------------------------------------------------------------- shutdown
    async def shutdown(self, o: Order) -> bool:
        """Run the node's shutdown plan (plans.shutdown_plan); True when the node ended off (or
        has no BMC and its jobs were stopped)."""
        started = clock.now()
        bmc = self.devices.bmc(o.node)
        plan = shutdown_plan(
            self.devices.node(o.node),
            self.s,
            now=started,
            jobs=o.jobs,
            retry=o.retry,
            bmc=bmc.device if bmc is not None else None,
            scheduler=self.scheduler.kind,
            scheduler_s=self.scheduler.stop_bound_s(len(o.jobs)),
        )
        await self.report.node_state(o, "shutting_down")
        run = _OffRun()
        fallback = bool(o.retry and self.devices.node(o.node).outlets)
        for step in plan.steps:
            if not run.applies(step):
                continue
            t = clock.now()
            try:
                async with asyncio.timeout(max(0.0, step.deadline - t)):
                    if step.action == "job_stop":
                        await self._stop_jobs(o)
                    elif step.action == "outlet_off":
                        if not await self.steps.outlet(o, self.steps.ref(o.node, step.device), on=False):
                            return False
                    else:
                        await self._bmc_step(o, bmc, step, run)
            except TimeoutError:
                if step.action == "soft_off":  # the ACPI shutdown's window is over: the hard off follows
                    run.soft_error = _past(f"{step.device} soft-off", started, step.deadline)
                    continue
                action = {"job_stop": "job_stop", "outlet_off": "outlet_off"}.get(step.action, "off")
                await self.report.failed(
                    o, action, step.device, t, _past(f"{step.device} {step.action}", started, step.deadline)
                )
                if step.action == "outlet_off":
                    return False
                if step.action != "job_stop":
                    run.bmc_failed = True
            if run.bmc_failed and not fallback:
                return False
        took = clock.now() - started
        detail = f"outlets off after the BMC failed ({took:.1f}s)" if run.bmc_failed else f"off after {took:.1f}s"
        await self.report.node_state(o, "off", detail)
        await self.scheduler.node_powered_off(o.node, saga_id=o.saga_id)
        return True

    async def _stop_jobs(self, o: Order) -> None:
        t = clock.now()
        try:
            jobs = list(o.jobs)
            if self.job_stopped is not None and jobs:  # a job is stopped once: by its own command
                ran = await asyncio.gather(*(self.job_stopped(o.saga_id, j) for j in jobs))
                jobs = [j for j, stopped in zip(jobs, ran, strict=True) if not stopped]
            detail = await self.scheduler.prepare_shutdown(o.node, saga_id=o.saga_id, jobs=jobs)
            await self.report.done(o, "job_stop", f"scheduler:{self.scheduler.kind}", t, detail=detail)
        except SchedulerError as exc:  # power still has to go down: the checkpoint is already durable
            await self.report.failed(o, "job_stop", f"scheduler:{self.scheduler.kind}", t, str(exc))

    async def _bmc_step(self, o: Order, bmc: PowerDriver, step: Step, run: _OffRun) -> None:
        """One BMC step of the plan (read, soft-off and wait, hard off and wait); what it found
        goes into ``run``. A device error ends the BMC's part reported (``action_failed``)."""
        t = clock.now()
        try:
            if step.action == "status":
                run.power = await self.steps.retrying(f"{bmc.device} status", bmc.status)
                if run.power == "off":
                    await self.report.done(o, "off", bmc.device, t, power_state="off", detail="already off")
            elif step.action == "soft_off":
                try:
                    await self.steps.retrying(f"{bmc.device} soft-off", bmc.soft_off)
                    await self.report.done(o, "soft_off", bmc.device, t, detail="ACPI shutdown requested")
                    if await self.steps.wait_state(bmc, "off", step.wait_s):
                        run.power = "off"
                        await self.report.done(o, "off", bmc.device, t, power_state="off", detail="soft-off completed")
                except PowerControlError as exc:
                    if not exc.retryable:
                        raise
                    run.soft_error = str(exc)
            else:  # "off": the hard off of a node still on
                await self.steps.retrying(f"{bmc.device} power off", bmc.off)
                if not await self.steps.wait_state(bmc, "off", step.wait_s):
                    raise PowerStateTimeout(f"{bmc.device}: still on {step.wait_s:.0f}s after a hard power off")
                run.power = "off"
                why = (
                    f"soft-off failed ({run.soft_error})"
                    if run.soft_error
                    else f"still on after {self.s.soft_off_timeout_s:.0f}s"
                )
                await self.report.done(o, "off", bmc.device, t, power_state="off", detail=f"hard off: {why}")
        except PowerControlError as exc:
            await self.report.failed(o, "off", bmc.device, t, str(exc), power_state="unknown")
            run.bmc_failed = True
            if o.retry and self.devices.node(o.node).outlets:
                log.warning("%s: the BMC failed again on a retry of its off: switching its outlets off", o.node)

    # -------------------------------------------------------------- restore
    async def restore(self, orders: Sequence[Order], *, issued: asyncio.Event | None = None) -> dict[str, bool]:
        """Power nodes on, group by group, each group planned as it starts; True per node that
        ended ready. ``issued`` is set once the last group's power-ons have been sent (its nodes'
        readiness still to come), or with a ramp once they are queued in it (the ramp spaces them
        and the next restore's nodes)."""
        result: dict[str, bool] = {}
        by_node: dict[str, list[Order]] = {}
        for o in orders:
            by_node.setdefault(o.node, []).append(o)
        left = list(by_node)
        while left:
            plan = restore_plan(
                left,
                {n: self.devices.node(n) for n in left},
                self.s,
                now=clock.now(),
                bmcs={n for n in left if self.devices.bmc(n) is not None},
                ramp=self.ramp,
            )
            step = plan.groups[0]  # this group now; the rest re-planned when it is done
            for n in step.nodes:
                self.ramp.book(n.node, n.pdus, n.slot)
            left = [n for g in plan.groups[1:] for n in (x.node for x in g.nodes)]
            last = not left
            members = [(o, n) for n in step.nodes for o in by_node[n.node]]
            log.info("restore: power-on group %d: %s", step.group, ", ".join(o.node for o, _ in members))
            readiness: dict[str, asyncio.Task] = {}  # each node's readiness runs from the moment it is on
            running = asyncio.gather(*(self._node(o, n, readiness) for o, n in members))
            if last and issued is not None and self.s.ramp.enabled:
                await asyncio.sleep(0)  # every power-on has its place in the ramp: the next restore may set up
                issued.set()
            oks = await running
            result.update({o.node: False for (o, _), ok in zip(members, oks, strict=True) if not ok})
            if last and issued is not None:
                issued.set()  # without a ramp (or nothing powered): once the last group's power-ons ran
            for node, task in readiness.items():
                result[node] = await task
        return result

    async def _node(self, o: Order, n: NodeRestore, readiness: dict[str, asyncio.Task]) -> bool:
        """One node of a group: its outlets (the switch, when it has no BMC: in its ramp slot),
        then its power-on; its readiness goes on in ``readiness``. Its own part is cut at the
        plan's bound from its turn."""
        started = clock.now()
        slot = RampSlot(self.ramp if self.s.ramp.enabled else None, o.node, n.pdus, n.slot, self._ramp_signal)
        turn = max(started, n.slot)
        try:
            async with asyncio.timeout(max(0.0, turn + n.bound_s - clock.now())):
                if n.switch == "outlet":  # its outlet is its power switch: the ramp gates it
                    ok = await self._in_ramp(o, slot, lambda s: self.steps.outlets(o, on=True, slot=s))
                else:
                    async with self._setup:  # standby power only: not in the ramp
                        ok = await self.steps.outlets(o, on=True)
        except TimeoutError:
            await self.report.failed(
                o, "outlet_on", "pdu", started, _past(f"{o.node}'s outlets", started, turn + n.bound_s)
            )
            return False
        if not ok:
            return False
        if await self._switch_on(o, n, slot, started):
            readiness[o.node] = asyncio.create_task(self._ready(o, n, started))
            return True
        return False

    async def _in_ramp(self, o: Order, slot: RampSlot, until: Callable[[RampSlot], Awaitable[T]]) -> T:
        """Run ``until(slot)`` in the node's ramp slot (the plan's), which returns once the node
        has started (a BMC driver's ``on_at`` sets its session up before the slot, then sends at
        it). No ramp configured: the slot is now."""
        if slot.ramp is None:
            return await until(slot)
        metrics.RAMP_QUEUED.inc()
        try:
            wait = slot.start - clock.now()
            if wait > 0.05:
                await self.report.node_state(o, "off", f"power-on ramp: starts in {wait:.1f}s")
            with trace.get_tracer("powerguard.power_control").start_as_current_span(
                f"ramp {o.node}", attributes={"powerguard.node": o.node, "powerguard.ramp_wait_s": round(wait, 3)}
            ):
                try:
                    return await until(slot)
                finally:
                    slot.done()
        finally:
            metrics.RAMP_QUEUED.dec()

    async def _switch_on(self, o: Order, n: NodeRestore, slot: RampSlot, started: float) -> bool:
        bmc = self.devices.bmc(o.node)
        if bmc is None:
            return True  # the outlet was the power switch (its outlet-on waited for the ramp)
        t = clock.now()
        try:
            async with self._setup:
                state = await self.steps.retrying(f"{bmc.device} status", bmc.status)
            if state == "on":
                await self.report.done(o, "on", bmc.device, t, power_state="on", detail="already on")
                return True
            async with self._window:
                # its turn: its ramp slot and its place in the window; its own part is bounded from here
                turn = max(clock.now(), n.slot)
                async with asyncio.timeout(max(0.0, turn + n.bound_s - clock.now())):
                    unclear = await self._command_on(o, bmc, slot)
                    await self.report.node_state(o, "booting")
                    left = self.s.boot_timeout_s - (clock.now() - started)
                    if not await self.steps.wait_state(bmc, "on", max(left, self.s.poll_interval_s)):
                        raise PowerStateTimeout(f"{bmc.device}: not on {self.s.boot_timeout_s:.0f}s after power-on")
                detail = f"on, although its power-on answer was: {unclear}" if unclear else None
                await self.report.done(o, "on", bmc.device, t, power_state="on", detail=detail)
                if self.s.batch_interval_s:
                    await asyncio.sleep(self.s.batch_interval_s)  # the place is free this long after "on"
            return True
        except TimeoutError:
            await self.report.failed(
                o, "on", bmc.device, t, _past(f"{bmc.device} power-on", started, t + n.bound_s), power_state="unknown"
            )
            return False
        except PowerControlError as exc:
            await self.report.failed(o, "on", bmc.device, t, str(exc), power_state="unknown")
            return False

    async def _command_on(self, o: Order, bmc: PowerDriver, slot: RampSlot) -> str | None:
        """Send the power-on (in the ramp's slot); None, or the error of a command that may have
        reached the BMC all the same (an answer lost or garbled): the node keeps its place in the
        window while a read of its power state decides, since its inrush may still come. A
        refused credential never reached it."""
        try:
            # the ramp's slot is when the BMC gets the command (a retry goes at once: its slot passed)
            await self._in_ramp(o, slot, lambda s: self.steps.retrying(f"{bmc.device} power on", lambda: bmc.on_at(s)))
            return None
        except PowerControlError as exc:
            refused = isinstance(exc, AuthenticationFailed | CredentialsDoubted)
            if refused or not await self.steps.wait_state(bmc, "on", self.s.device_timeout_s):
                raise
            log.warning("%s: on after a power-on that failed (%s)", o.node, exc)
            return str(exc)

    async def _ready(self, o: Order, n: NodeRestore, started: float) -> bool:
        probe = self.s.probes.get(o.node)
        if probe is not None and not (o.dry_run or self.devices.dry_run):
            deadline = started + self.s.boot_timeout_s
            last = ""
            while True:
                ok, last = await probe_once(probe.url, timeout_s=min(self.s.device_timeout_s, 5.0))
                if ok:
                    break
                if clock.now() + probe.interval_s > deadline:
                    await self.report.failed(
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
            await self.report.failed(o, "job_start", f"scheduler:{self.scheduler.kind}", started, str(exc))
        await self.report.node_state(o, "ready", f"ready {clock.now() - started:.1f}s after power-on began")
        return True

    # -------------------------------------------------------------- jobs
    async def job(self, o: Order, *, start: bool, nodes: Sequence[str]) -> bool:
        action = "job_start" if start else "job_stop"
        t = clock.now()
        job = o.jobs[0]
        try:
            fn = self.scheduler.start_job if start else self.scheduler.stop_job
            detail = await fn(job, nodes=nodes, saga_id=o.saga_id)
            await self.report.done(o, action, f"scheduler:{self.scheduler.kind}", t, detail=detail)
            return True
        except SchedulerError as exc:
            await self.report.failed(o, action, f"scheduler:{self.scheduler.kind}", t, str(exc))
            return False
