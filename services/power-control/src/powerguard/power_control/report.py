"""What power-control says, and what it records of each command: every event through
:meth:`Reporter.emit` (its metrics, the read-back's expectations, then the bus), each command's
end in the ledger (:meth:`Reporter.finish`), a refusal or a sequence that died as an
``action_failed`` the saga reacts to at once."""

from __future__ import annotations

import asyncio
import logging
import time

from powerguard.bus import Bus
from powerguard.schemas import (
    Envelope,
    JobRestartRequested,
    NodeState,
    PowerActionDone,
    PowerActionFailed,
    PowerOnRequested,
    PowerResultData,
    ShutdownRequested,
    UpsOutputOffRequested,
    command_key,
)

from . import metrics
from .config import PowerControlSettings
from .ledger import Ledger
from .readback import ReadBack
from .step_report import Order
from .ups_output import ups_result

log = logging.getLogger("powerguard.power_control.service")


class Reporter:
    def __init__(self, bus: Bus, settings: PowerControlSettings, readback: ReadBack) -> None:
        self.bus, self.settings, self.readback = bus, settings, readback
        self.ledger: Ledger | None = None  # set once the service has started (its bucket opened)
        self.executed: list[str] = []  # idempotency keys this process executed, in order

    async def emit(self, event: Envelope) -> None:
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

    async def stop_ran(self, saga_id: str, job: str) -> bool:
        """Whether the saga's own stop of ``job`` ran (the ledger's answer, waited for): a job is
        stopped once, by its own command, not again by each node's shutdown."""
        if self.ledger is None:
            return False
        return await self.ledger.ran(
            command_key(saga_id, job, "stop"),
            grace_s=self.settings.job_stop_grace_s,
            wait_s=self.settings.job_stop_wait_s,
        )

    async def finish(self, key: str, ok: bool, detail: str | None = None) -> None:
        """The ledger entry ends (done or failed), retried through a broker outage: an entry
        left 'running' would be resumed at the next start."""
        self.executed.append(key)
        assert self.ledger is not None
        for attempt in range(6):
            try:
                await self.ledger.finish(key, "done" if ok else "failed", detail or "")
                return
            except Exception as exc:
                log.warning("ledger %s not updated (attempt %d): %s", key, attempt + 1, exc)
                await asyncio.sleep(min(2**attempt, 10))
        log.error("ledger %s left as it was after 6 attempts", key)

    async def failure(self, order: Order, action: str, exc: BaseException) -> None:
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
                await self.emit(event)
                return
            except Exception as publish_exc:
                log.warning("action_failed for %s not published (attempt %d): %s", order.key, attempt + 1, publish_exc)
                await asyncio.sleep(min(2**attempt, 10))

    async def refused(self, event: Envelope, why: str) -> None:
        d = event.data
        metrics.REFUSED.labels(event.short_type).inc()
        log.error("refused %s %s: %s", event.short_type, event.id, why)
        if isinstance(event, UpsOutputOffRequested):
            await self.emit(
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
        await self.emit(
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
