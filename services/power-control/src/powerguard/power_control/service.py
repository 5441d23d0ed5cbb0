"""The power-control service: executes the coordinator's commands on BMCs, PDUs and the
scheduler, exactly once per idempotency key, and reports every step.

One way down for a command: :meth:`PowerControl.on_command` -> ``intake.py`` (admitted by
admission.py's pure rule, claimed in the ledger) -> ``executor.py`` (a task per command, one
sequence per node) -> ``plans.py`` (the plan, pure) -> ``sequences.py`` (the runner executes it)
-> ``step_report.py`` / ``report.py`` (each step's result on the bus, the command's end in the
ledger). This class only wires them and runs the service's loops (the consumer, the read-back,
the device checks).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import Any

from powerguard.bus import Bus, ReadyLog, ServiceContext
from powerguard.bus.roles import durable_filters, durable_names
from powerguard.schemas import (
    ConfigError,
    Envelope,
    JobRestartRequested,
    JobStopRequested,
    NodeState,
    NodeStateData,
    PowerOnRequested,
    SagaStateChanged,
    ShutdownRequested,
    SiteConfig,
    UpsOutputOffRequested,
    decode,
)

from . import device_health
from .config import PowerControlSettings
from .drivers import Devices
from .errors import PowerControlError
from .executor import Executor
from .intake import Admitted, Intake, Refused
from .ledger import Ledger
from .probes import probe_once
from .readback import ReadBack
from .readback import meaning as readback_meaning
from .report import Reporter
from .saga_edges import SagaEdges
from .schedulers import make_scheduler
from .schedulers.base import DryRunScheduler
from .sequences import Sequencer
from .ups_output import UpsOutputs

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
        self.readback = ReadBack(interval_s=self.settings.readback_s, window_s=self.settings.readback_window_s)
        self.report = Reporter(bus, self.settings, self.readback)
        emit = self.report.emit
        self.seq = Sequencer(self.devices, self.scheduler, self.settings, emit, self.report.stop_ran)
        dry_jobs = DryRunScheduler(self.scheduler.kind)  # a drill names the adapter the site runs
        self.dry = Sequencer(Devices(site, self.settings, dry_run=True), dry_jobs, self.settings, emit)
        self._nodes = {n.name for n in site.nodes}
        self.ups_outputs = UpsOutputs(site, timeout_s=max(self.settings.device_timeout_s, 30.0))
        self.executor = Executor(
            self.seq,
            self.dry,
            self.report,
            self.settings,
            devices=self.devices,
            ups=self.ups_outputs,
            nodes=self._nodes,
            readback=self.readback,
        )
        self.intake: Intake | None = None  # once started (the ledger's bucket opened)
        self._consumer: Any = None
        self._reader: asyncio.Task | None = None
        self.saga_edges = SagaEdges(self.scheduler, self._nodes)
        self._edges: asyncio.Task | None = None

    @property
    def executed(self) -> list[str]:
        """Idempotency keys this process executed, in order."""
        return self.report.executed

    # -------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        ledger = Ledger(await self.bus.power_actions(), self.instance)
        self.report.ledger = ledger
        self.intake = Intake(self.bus, self.settings, nodes=self._nodes, ups=self.ups_outputs, ledger=ledger)
        for entry in await ledger.unfinished():
            try:
                event = decode(json.dumps(entry.event))
            except Exception as exc:  # a ledger entry we cannot read must not stop the service
                log.error("ledger entry %s unreadable (%s); marked failed", entry.key, exc)
                await ledger.finish(entry.key, "failed", f"unreadable: {exc}")
                continue
            why = await self.intake.refusal(event)  # too old, or its saga moved on (restoring the node)
            if why is not None:
                log.warning("not resuming %s left running by a previous power-control: %s", entry.key, why)
                await ledger.finish(entry.key, "failed", f"not resumed: {why}")
                continue
            log.info("resuming %s left running by a previous power-control", entry.key)
            self.executor.run(event, entry.key)
        self._reader = asyncio.create_task(self._read_back_loop())
        listener = await self.bus.listen(SagaStateChanged, subject=self.bus.subjects.saga("*")).start()
        self._edges = asyncio.create_task(self._saga_edges_loop(listener))
        durable = durable_names(self.site.site)["power-control"]
        self._consumer = await self.bus.consume(
            *COMMANDS,
            handler=self.on_command,
            durable=durable,
            subject=durable_filters(self.bus.names, self.site.site)[durable],
            since_s=self.settings.max_command_age_s,
        )

    async def _saga_edges_loop(self, listener) -> None:
        async with listener:
            async for event in listener:
                await self.saga_edges.on(event)

    async def stop(self, grace_s: float = 5.0) -> None:
        for task in (self._reader, self._edges):
            if task is not None:
                task.cancel()
        if self._consumer is not None:
            await self._consumer.stop()
        await self.executor.stop(grace_s)
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
        await self.executor.idle()

    # -------------------------------------------------------------- commands
    async def on_command(self, event: Envelope) -> None:
        """Admit, claim and run one command (or refuse it, reported); never waits on the sequence."""
        assert self.intake is not None, "start() first"
        taken = await self.intake.take(event)
        if isinstance(taken, Refused):
            await self.report.refused(taken.event, taken.why)
        elif isinstance(taken, Admitted):
            self.executor.run(taken.event, taken.key)

    # -------------------------------------------------------------- read-back
    async def _read_back_loop(self) -> None:
        """Read back, every ``readback_s``, each node whose last command has not reached its
        result; each node on its own (a dead BMC never delays another's read)."""
        while True:
            await asyncio.sleep(min(1.0, self.settings.readback_s))
            due = self.readback.due(time.monotonic(), self.executor.busy())
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
            await self.report.emit(
                NodeState(
                    data=NodeStateData(node=node, state=state, saga_id=exp.saga_id, detail="read back by power-control")
                )
            )


DEGRADED_RECHECK_S = 5.0


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
