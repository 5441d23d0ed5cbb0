"""The coordinator's ack path end to end, as its service runs it: the jobs' durable consumer
(``Bus.consume_batches``, the service's batch, filter and durable) hands each batch to the site
core, every changed record is stored (CAS, split records) before its state events and commands
are published, one batch after another (coordinator/service.py's ``on_batch`` and ``_commit``).
What it adds is the clock: when each batch was applied, stored and published."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Followed:
    """What the coordinator did with the acks, on this machine's clock (time.time)."""

    expected: int  # ranks acked (an ack speaks for its rank, or rank 0's for its job's)
    nodes: int  # shutdown commands expected
    applied: int = 0
    batches: int = 0
    shutdowns_stored: int = 0
    shutdowns_published: int = 0
    applied_at: float | None = None  # every ack applied and the record stored
    shutdowns_stored_at: float | None = None  # every node's shutdown command in the stored record
    shutdowns_published_at: float | None = None  # ... and stored by JetStream (power-control's input)
    batch_s: list[float] = field(default_factory=list)
    cpu_s: float | None = None  # this process's CPU from the consumer's start to the last command published
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def figures(self, last_ack: float | None) -> dict:
        def after(t: float | None) -> float | None:
            return None if t is None or last_ack is None else round(max(0.0, t - last_ack), 3)

        took = sorted(self.batch_s)
        return {
            "acks_applied": self.applied,
            "batches": self.batches,
            "batch_s": {"p50": round(took[len(took) // 2], 3), "max": round(took[-1], 3)} if took else None,
            "acks_applied_after_last_s": after(self.applied_at),
            "last_ack_to_shutdowns_s": after(self.shutdowns_stored_at),
            "last_ack_to_shutdowns_published_s": after(self.shutdowns_published_at),
            "cpu_s": None if self.cpu_s is None else round(self.cpu_s, 2),
            "cpu_us_per_ack": None if self.cpu_s is None else round(self.cpu_s / max(self.applied, 1) * 1e6, 1),
            "shutdown_commands": self.shutdowns_stored,
            "shutdown_commands_published": self.shutdowns_published,
        }


class Follower:
    """The coordinator's side of an outage after its requests went out: owns the core, the
    store's revisions and the figures; ``start`` binds the consumer, ``stop`` ends it."""

    def __init__(self, bus: Any, core: Any, store: Any, revisions: dict[str, int], followed: Followed, site: str):
        self.bus = bus
        self.core = core
        self.store = store
        self.revisions = revisions  # saga -> the head's revision the next save compares with
        self.followed = followed
        self.site = site
        self._consumer = None
        self._cpu0 = 0.0

    async def start(self, policy: Any) -> None:
        from powerguard.bus.roles import INPUT_BATCH, durable_filters, durable_names
        from powerguard.coordinator.service import JOB_TYPES

        durable = durable_names(self.site)["coordinator-jobs"]
        self._cpu0 = time.process_time()
        self._consumer = await self.bus.consume_batches(
            *JOB_TYPES,
            batch_handler=self.on_batch,
            durable=durable,
            subject=durable_filters(self.bus.names, self.site)[durable],
            batch=INPUT_BATCH,
            since_s=policy.max_event_age_s,
            max_skew_s=policy.max_clock_skew_s,
        )

    async def stop(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()

    async def on_batch(self, items: list) -> None:
        from powerguard.coordinator import heap
        from powerguard.coordinator.outbox import command_event, state_events

        f = self.followed
        t = time.perf_counter()
        step = self.core.apply([(i.event, None) for i in items], time.time())
        published: list = []
        for rec in step.changed:  # stored before anything it implies is published
            sid = rec.saga_id
            self.revisions[sid] = await self.store.save(rec, self.revisions[sid])
            cmds = step.commands.get(sid, [])
            f.shutdowns_stored += sum(1 for c in cmds if c.kind == "shutdown")
            for ev in state_events(rec, step.history_from.get(sid, 0)):  # in order, as the service does
                await self.bus.publish(ev)
            published += [(c.kind, command_event(rec, c)) for c in cmds]
        f.applied += sum(_ranks(i.event) for i in items)
        now = time.time()
        if f.applied >= f.expected and f.applied_at is None:
            f.applied_at = now
        if f.shutdowns_stored >= f.nodes and f.shutdowns_stored_at is None:
            f.shutdowns_stored_at = now
        sem = asyncio.Semaphore(128)  # the service's publish window

        async def one(ev) -> None:
            async with sem:
                await self.bus.publish(ev)

        await asyncio.gather(*(one(ev) for _, ev in published))
        f.shutdowns_published += sum(1 for kind, _ in published if kind == "shutdown")
        if f.shutdowns_published >= f.nodes and f.shutdowns_published_at is None:
            f.shutdowns_published_at = time.time()
            f.cpu_s = time.process_time() - self._cpu0
            f.done.set()
        heap.keep()
        f.batches += 1
        f.batch_s.append(time.perf_counter() - t)


def _ranks(event: Any) -> int:
    """The ranks one ack speaks for (1 for anything else the consumer takes)."""
    speaks_for = getattr(event.data, "speaks_for", None)
    return len(speaks_for()) if speaks_for is not None else 1
