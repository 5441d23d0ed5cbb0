"""Simulated training ranks, many per process: they register in ``pg_agents``, heartbeat as
the ckpt-agent does (every ``heartbeat_s``; None: never, for benchmarks of thousands of ranks),
and answer checkpoint requests with acks over the real bus. Used by coordinator tests and benchmarks
where real ``torch.distributed`` ranks would only add minutes."""

from __future__ import annotations

import asyncio
import os
import time
from collections import defaultdict
from dataclasses import dataclass, field

from powerguard.bus import Bus
from powerguard.bus.agents import announce
from powerguard.schemas import (
    AgentData,
    AgentHeartbeat,
    AgentRegistered,
    CheckpointDurable,
    CheckpointDurableData,
    CheckpointFailed,
    CheckpointFailedData,
    CheckpointRequested,
    Durations,
    decode,
)


@dataclass
class SimulatedRanks:
    """``jobs`` maps a job to the node of each rank (``{"j1": ["n1", "n1", "n2", "n2"]}``)."""

    bus: Bus
    jobs: dict[str, list[str]]
    step: int = 100
    ack_delay_s: float = 0.0
    heartbeat_s: float | None = 1.0  # a coordinator takes a job not heard after power returned for dead
    silent: set[tuple[str, int]] = field(default_factory=set)  # never answer
    failing: set[tuple[str, int]] = field(default_factory=set)  # answer ckpt.failed
    requests_seen: dict[tuple[str, int], float] = field(default_factory=dict)  # (job, rank) -> perf_counter
    acked: dict[str, set[int]] = field(default_factory=lambda: defaultdict(set))
    acked_at: dict[tuple[str, int], float] = field(default_factory=dict)  # perf_counter after the ack was stored
    _subs: list = field(default_factory=list)
    _tasks: set = field(default_factory=set)
    _ack_slots: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(256))

    async def start(self, *, register: bool = True, heard: bool = False) -> None:
        """Register every rank (and with ``heard``, beat once at once: the coordinator counts a
        rank heard from its second record, as a live agent's first heartbeat), then answer."""
        if register:
            await self._announce_all(AgentRegistered)
            if heard:
                await self._announce_all(AgentHeartbeat)
            if self.heartbeat_s:
                beat = asyncio.create_task(self._heartbeat(self.heartbeat_s))
                self._tasks.add(beat)
                beat.add_done_callback(self._tasks.discard)
        for job in self.jobs:
            sub = await self.bus.nc.subscribe(self.bus.subjects.ckpt_request(job), cb=self._handler(job))
            self._subs.append(sub)
        await self.bus.nc.flush()

    async def _announce_all(self, kind: type[AgentRegistered] | type[AgentHeartbeat]) -> None:
        sem = asyncio.Semaphore(256)

        async def one(job: str, rank: int, node: str) -> None:
            async with sem:
                data = AgentData(
                    job=job, rank=rank, world_size=len(self.jobs[job]), node=node, pid=os.getpid(), step=self.step
                )
                await announce(self.bus, kind(source=f"/powerguard/sim/{job}/{rank}", data=data))

        await asyncio.gather(*(one(j, r, n) for j, nodes in self.jobs.items() for r, n in enumerate(nodes)))

    async def _heartbeat(self, every_s: float) -> None:
        while True:
            await asyncio.sleep(every_s)
            try:
                await self._announce_all(AgentHeartbeat)
            except Exception:  # a broker restart in a test: the next beat tries again, as an agent's does
                continue

    def _handler(self, job: str):
        """One subscription per job stands in for the job's ranks: every rank sees the request
        when it reaches this process (decoded once, not once per simulated rank)."""

        async def on_request(msg) -> None:
            seen = time.perf_counter()
            request = decode(msg.data)
            assert isinstance(request, CheckpointRequested)
            for rank in range(len(self.jobs[job])):
                self.requests_seen.setdefault((job, rank), seen)
                if (job, rank) in self.silent:
                    continue
                task = asyncio.create_task(self._ack(request, job, rank))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

        return on_request

    async def _ack(self, request: CheckpointRequested, job: str, rank: int) -> None:
        if self.ack_delay_s:
            await asyncio.sleep(self.ack_delay_s)
        base = dict(
            request_id=request.data.request_id,
            saga_id=request.data.saga_id,
            job=job,
            rank=rank,
            world_size=len(self.jobs[job]),
            step=self.step,
        )
        if (job, rank) in self.failing:
            event: CheckpointDurable | CheckpointFailed = CheckpointFailed(
                data=CheckpointFailedData(**base, error="simulated disk full")
            )
        else:
            event = CheckpointDurable(
                data=CheckpointDurableData(
                    **base,
                    path=f"/sim/{job}/step-{self.step}",
                    bytes=1024,
                    digest="0" * 32,
                    durations=Durations(total_s=self.ack_delay_s),
                )
            )
        async with self._ack_slots:  # one process stands in for many ranks: bound its in-flight acks
            await self.bus.publish(event)
        self.acked_at[(job, rank)] = time.perf_counter()
        self.acked[job].add(rank)

    async def stop(self) -> None:
        for sub in self._subs:
            await sub.unsubscribe()
        self._subs.clear()
        for task in list(self._tasks):
            task.cancel()
