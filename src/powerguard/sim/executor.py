"""A simulated power-control for coordinator tests: it executes power and job commands
(deduplicated by idempotency key, as the real one does), reports node states and lets the
simulated jobs resume from their checkpoint step."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field

from powerguard.bus import Bus
from powerguard.schemas import (
    Envelope,
    JobData,
    JobRestartRequested,
    JobResumed,
    JobStopRequested,
    NodeState,
    NodeStateData,
    PowerOnRequested,
    ShutdownRequested,
)


@dataclass
class SimulatedPowerControl:
    bus: Bus
    resume_step: dict[str, int] = field(default_factory=dict)  # job -> step it resumes from
    delay_s: float = 0.0
    received: Counter = field(default_factory=Counter)  # idempotency key -> deliveries
    executed: list[str] = field(default_factory=list)  # idempotency keys, in order
    node_power: dict[str, str] = field(default_factory=dict)
    durable: str = "sim-power-control"
    _consumer: object = None

    async def start(self) -> None:
        s = self.bus.subjects
        self._consumer = await self.bus.consume(
            ShutdownRequested,
            PowerOnRequested,
            JobStopRequested,
            JobRestartRequested,
            handler=self.on_command,
            durable=self.durable,
            subject=[s.power_cmd("*"), s.job_cmd("*")],
        )

    async def stop(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()

    async def on_command(self, event: Envelope) -> None:
        key = event.data.idempotency_key
        self.received[key] += 1
        if key in self.executed:
            return
        self.executed.append(key)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        d = event.data
        if isinstance(event, ShutdownRequested):
            self.node_power[d.node] = "off"
            await self.bus.publish(NodeState(data=NodeStateData(node=d.node, state="off", saga_id=d.saga_id)))
        elif isinstance(event, PowerOnRequested):
            self.node_power[d.node] = "on"
            await self.bus.publish(NodeState(data=NodeStateData(node=d.node, state="ready", saga_id=d.saga_id)))
        elif isinstance(event, JobRestartRequested):
            await self.bus.publish(
                JobResumed(data=JobData(job=d.job, saga_id=d.saga_id, step=self.resume_step.get(d.job)))
            )

    def actions(self) -> list[tuple[str, str]]:
        """(target, action) of every executed command."""
        return [tuple(k.split("/")[1:3]) for k in self.executed]
