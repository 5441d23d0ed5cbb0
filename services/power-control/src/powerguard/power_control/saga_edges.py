"""An outage's edges for the scheduler adapter: the first announcement of a saga (its nodes at
risk: keep new work off them, e.g. Kubernetes' taint and Kueue's hold) and its end (undo what no
restore undid: a cancelled outage powers nothing off). Read live from the coordinator's
``pg.saga.<id>`` announcements (a core subscription: power-control may read them, never write).
A drill's saga changes nothing. Missed while disconnected: the shutdown's own ``job_stop`` step
fences the node again, and every action here is idempotent."""

from __future__ import annotations

import logging

from powerguard.schemas import SagaStateChanged

from .schedulers import Scheduler

log = logging.getLogger(__name__)


class SagaEdges:
    def __init__(self, scheduler: Scheduler, nodes: set[str]) -> None:
        self.scheduler, self.nodes = scheduler, nodes
        self.started: set[str] = set()
        self.ended: set[str] = set()

    def edge(self, event: SagaStateChanged) -> str | None:
        """``"start"``, ``"end"`` or None: what this announcement means for the adapter (pure)."""
        d = event.data
        if d.drill or d.saga_id in self.ended:
            return None
        if d.state.terminal:
            return "end"
        if d.saga_id not in self.started and d.state.before_shutdown:
            return "start"
        return None

    async def on(self, event: SagaStateChanged) -> str | None:
        """Act on one announcement; returns what the adapter did (None: nothing to do)."""
        edge = self.edge(event)
        if edge is None:
            return None
        d = event.data
        nodes = [n for n in d.nodes if n in self.nodes]
        try:
            if edge == "start":
                self.started.add(d.saga_id)
                done = await self.scheduler.on_battery(nodes, saga_id=d.saga_id)
            else:
                self.ended.add(d.saga_id)
                self.started.discard(d.saga_id)
                done = await self.scheduler.outage_over(nodes, saga_id=d.saga_id)
        except Exception as exc:  # the adapter's failure is reported; the saga goes on regardless
            log.error("saga %s %s: the %s adapter failed: %s", d.saga_id, edge, self.scheduler.kind, exc)
            return f"failed: {exc}"
        if done:
            log.info("saga %s %s: %s", d.saga_id, edge, done)
        return done
