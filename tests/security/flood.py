"""An outage while one training job's agent floods the bus, on the shipped configuration: a real
nats-server with ``compose/nats.conf`` (``sync_interval: always``) and the credentials of
``powerguard creds``, the coordinator and power-control (dry-run devices) each a process of its
own, the flood from a process of its own with jobA's agent credential (``flooder.py``). jobB
runs on n2 and answers like an agent (registration, acks, resume) from the measuring process.

One round: ups-monitor's credential publishes ``on_battery``; jobB's checkpoint request reaches
jobB (``request_ms``: from the publish to its arrival on jobB's own subject). In a round that
also shuts down, the UPS then says 50 s (below the 60 s reserve): the time to n2 reported off
(``shutdown_s``) is held against that battery. Then mains returns and the saga ends. Shared by
``tests/security/test_flood.py`` (one round of each kind) and ``bench/isolation.py`` (many).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from powerguard.bus import Bus
from powerguard.bus.agents import announce
from powerguard.bus.roles import durable_filters
from powerguard.schemas import (
    AgentData,
    AgentHeartbeat,
    AgentRegistered,
    CheckpointDurable,
    CheckpointDurableData,
    CheckpointRequested,
    JobData,
    JobResumed,
    NodeState,
    OnBattery,
    OnLine,
    PowerStatus,
    SagaStateChanged,
)

from .conftest import SITE, Deployment, eventually
from .services import POLICY, reading

ROOT = Path(__file__).resolve().parents[2]
BURST = 60_000  # the burst of junk that once made ups-monitor's publish fail after 10 s
RESERVE_S = 60.0
LOW_RUNTIME_S = 50.0  # the UPS's word in a round that shuts down: below the reserve
# sent before the outage starts (registry: 16,000 of 16 KB fill the 256 MiB bucket)
FLOOD_ON = {"flood": 5_000, "acks64": 16_000, "drill1mb": 20, "registry": 17_000}


def site_yaml(path: Path) -> Path:
    policy = {**POLICY, "ckpt_timeout_s": 20, "shutdown_reserve_s": RESERVE_S, "tick_s": 0.1}
    site = {
        "site": SITE,
        "ups": [{"name": "ups-a", "driver": "nut"}],
        "nodes": [{"name": n, "feeds": ["ups-a"]} for n in ("n1", "n2")],
        "coordinator": policy,
        "power_control": {"dry_run": True, "gather_s": 0.1, "poll_interval_s": 0.1},
    }
    path.write_text(json.dumps(site))  # YAML is a superset of JSON
    return path


@dataclass
class Services:
    """The coordinator and power-control, each a process with its own credential."""

    dep: Deployment
    config: Path
    procs: list[asyncio.subprocess.Process] = field(default_factory=list)

    async def start(self, log_dir: Path) -> Services:
        for module, role in (("powerguard.coordinator", "coordinator"), ("powerguard.power_control", "power-control")):
            log = open(log_dir / f"{role}.log", "ab")
            self.procs.append(
                await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    module,
                    "--config",
                    str(self.config),
                    "--url",
                    self.dep.url,
                    "--creds",
                    str(self.dep.creds_of(role)),
                    "--http-port",
                    "0",
                    stdout=log,
                    stderr=log,
                )
            )
        return self

    async def stop(self) -> None:
        for p in self.procs:
            if p.returncode is None:
                p.terminate()
        for p in self.procs:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(p.wait(), 20)


@dataclass(frozen=True)
class Kind:
    """A flood: who sends it, on which subjects, how large each message is."""

    role: str
    job: str | None
    subjects: tuple[str, ...]
    size: int = 256
    spread: int = 0  # keys: each subject gets .<n % spread> (a bucket's keys)


def flood_kind(dep: Deployment, kind: str) -> Kind:
    """``flood``/``burst``: jobA's junk on its own rank 0's ack subject; ``acks64``: jobA's 16 KiB
    junk spread over 64 of its ranks' ack subjects (no per-subject limit bites); ``drill1mb``: the
    operator's 1 MB junk on the one power subject it may use, a drill's; ``registry``: jobA's
    16 KB values under its own keys of the shared agent registry, until the bucket is full."""
    s = dep.names.subjects
    if kind == "acks64":
        return Kind("agent", "jobA", tuple(s.ckpt_ack("jobA", r) for r in range(64)), 16_000)
    if kind == "drill1mb":
        return Kind("operator", None, (s.drill_power(SITE, "ups-a"),), 1_000_000)
    if kind == "registry":  # jobA's own keys in the shared registry, until the bucket is full
        return Kind("agent", "jobA", (f"$KV.{dep.names.agents}.jobA.n1",), 16_000, spread=1_000_000)
    return Kind("agent", "jobA", (s.ckpt_ack("jobA", 0),))


class Flooder:
    """A party gone rogue: junk on the subjects its credential lets it fill, from a process of its own."""

    def __init__(self, dep: Deployment, count: int = 0, kind: str = "flood") -> None:
        self.dep, self.count, self.kind = dep, count, flood_kind(dep, kind)
        self.proc: asyncio.subprocess.Process | None = None
        self.sent = 0
        self._reader: asyncio.Task | None = None
        self._started = asyncio.Event()

    async def start(self) -> Flooder:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.security.flooder",
            "--url",
            self.dep.url,
            "--creds",
            str(self.dep.creds_of(self.kind.role, self.kind.job)),
            *(x for subject in self.kind.subjects for x in ("--subject", subject)),
            "--count",
            str(self.count),
            "--size",
            str(self.kind.size),
            "--spread",
            str(self.kind.spread),
            stdout=asyncio.subprocess.PIPE,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        self._reader = asyncio.create_task(self._read())
        await asyncio.wait_for(self._started.wait(), 30)
        return self

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        async for raw in self.proc.stdout:
            line = raw.decode().split()
            if line[:1] == ["flooding"]:
                self._started.set()
            elif line[:1] == ["sent"]:
                self.sent = int(line[1])

    async def until_sent(self, n: int, timeout: float = 60.0) -> None:
        await eventually(lambda: self.sent >= n, timeout, f"the flood to reach {n} messages", every=0.05)

    async def stop(self) -> int:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.terminate()
        if self.proc is not None:
            await asyncio.wait_for(self.proc.wait(), 30)
        if self._reader is not None:
            await asyncio.wait_for(self._reader, 10)
        return self.sent


@dataclass
class Round:
    kind: str  # idle | flood | burst | acks64 | drill1mb | registry
    request_ms: float  # on_battery published -> jobB has its request
    stored_ms: float = 0.0  # ... -> the server stored the on_battery (ups-monitor's publish returned)
    issued_ms: float = 0.0  # ... -> the coordinator made the request (its event's time)
    shutdown_s: float | None = None
    junk_sent: int = 0


class Site:
    """The measuring side: ups-monitor's and jobB's connections, the observer's view."""

    def __init__(self, dep: Deployment) -> None:
        self.dep = dep
        self.states: list[tuple[str, str]] = []  # (saga, state)
        self.requests: list[tuple[float, CheckpointRequested]] = []
        self.off: list[tuple[float, str]] = []
        self._tasks: list[asyncio.Task] = []

    async def start(self) -> Site:
        d = self.dep
        self.ups = await d.connect("ups-monitor")
        self.job = await d.connect("agent", job="jobB")
        self.observer = await d.connect("observer")
        requests = await self.job.listen(CheckpointRequested, subject=self.job.subjects.ckpt_request("jobB")).start()
        self._tasks.append(asyncio.create_task(self._follow_requests(requests)))
        self._tasks.append(asyncio.create_task(self._follow_observed()))
        await self.register()
        self._tasks.append(asyncio.create_task(self._heartbeats()))
        return self

    async def _heartbeats(self) -> None:
        """jobB's rank heartbeats every second, as an agent does (every 5 s by default)."""
        while True:
            await asyncio.sleep(1.0)
            with contextlib.suppress(Exception):
                await self.register(heartbeat=True)

    async def register(self, heartbeat: bool = False) -> None:
        event = AgentHeartbeat if heartbeat else AgentRegistered
        await announce(self.job, event(data=AgentData(job="jobB", rank=0, world_size=1, node="n2", step=100)))

    async def _follow_requests(self, sub) -> None:
        async for ev in sub:
            self.requests.append((time.time(), ev))
            d = ev.data
            ack = CheckpointDurableData(
                request_id=d.request_id,
                saga_id=d.saga_id,
                job="jobB",
                rank=0,
                world_size=1,
                step=101,
                path="/ckpt/jobB/101",
                bytes=1,
                digest="0" * 32,
            )
            with contextlib.suppress(Exception):
                await self.job.publish(CheckpointDurable(data=ack))

    async def _follow_observed(self) -> None:
        s = self.observer.subjects
        async for ev in self.observer.subscribe(
            SagaStateChanged, NodeState, subject=[s.saga("*"), s.power_result("*")]
        ):
            if isinstance(ev, SagaStateChanged):
                self.states.append((ev.data.saga_id, ev.data.state.value))
            elif ev.data.state == "off":
                self.off.append((time.time(), ev.data.node))

    def ended(self, saga: str) -> bool:
        return any(sid == saga and state in ("done", "cancelled", "failed") for sid, state in self.states)

    async def outage(
        self, kind: str, *, shut_down: bool, flood_over: Callable[[], Awaitable[int]], timeout: float = 120.0
    ) -> Round:
        """One outage; ``flood_over`` ends the flood (the number of junk messages sent) once the
        request and the shutdown were measured, before power returns (jobB's resume, on the
        jobs' stream, would wait behind jobA's junk: docs/security.md). Returns its figures once
        its saga ended."""
        seen = len(self.requests)
        t0 = time.time()
        await self.ups.publish(OnBattery(data=reading(True, 300)))
        stored = time.time()
        await eventually(lambda: len(self.requests) > seen, timeout, "jobB's checkpoint request")
        t1, request = self.requests[seen]
        saga = request.data.saga_id
        ms = lambda t: round((t - t0) * 1000, 1)  # noqa: E731
        out = Round(kind, ms(t1), stored_ms=ms(stored), issued_ms=ms(request.time.timestamp()))
        if shut_down:
            off_seen = len(self.off)
            t2 = time.time()
            await self.ups.publish(PowerStatus(data=reading(True, LOW_RUNTIME_S)))
            await eventually(
                lambda: any(n == "n2" for _, n in self.off[off_seen:]), LOW_RUNTIME_S, "n2 shut down within the battery"
            )
            out.shutdown_s = round(next(t for t, n in self.off[off_seen:] if n == "n2") - t2, 3)
        out.junk_sent = await flood_over()
        await self.ups.publish(OnLine(data=reading(False, 300)))
        if shut_down:  # restored: n2 powered on (dry-run), jobB restarted and resumes
            await eventually(lambda: (saga, "restoring") in self.states, timeout, "the restore")
            await self.job.publish(JobResumed(data=JobData(job="jobB", saga_id=saga, step=101)))
        # else power back before any shutdown: the saga ends once jobB is heard from (its heartbeats)
        await eventually(lambda: self.ended(saga), timeout, f"saga {saga} to end")
        return out

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()


async def rounds(dep: Deployment, tmp: Path, plan: list[tuple[str, bool]]) -> list[Round]:
    """Run ``plan`` ((kind, shut down) per round: ``idle``, ``flood`` at the highest rate the
    server takes from jobA, or ``burst`` of :data:`BURST` messages) on one site."""
    services = await Services(dep, site_yaml(tmp / "site.yaml")).start(tmp)
    site = await Site(dep).start()
    out: list[Round] = []
    try:
        await wait_ready(dep)
        for kind, shut_down in plan:
            if kind == "idle":
                out.append(await site.outage(kind, shut_down=shut_down, flood_over=_nothing))
                continue
            flooder = await Flooder(dep, count=BURST if kind == "burst" else 0, kind=kind).start()
            try:
                await flooder.until_sent(FLOOD_ON.get(kind, 1))  # the flood is on
                out.append(await site.outage(kind, shut_down=shut_down, flood_over=flooder.stop))
            finally:
                await flooder.stop()
    finally:
        await site.close()
        await services.stop()
    return out


async def _nothing() -> int:
    return 0


async def wait_ready(dep: Deployment) -> None:
    """Both coordinator consumers bound (the durables have a reader waiting)."""
    admin: Bus = await dep.connect("admin", service="admin-ready")

    async def bound() -> bool:
        for durable, filters in durable_filters(dep.names, SITE).items():
            info = await admin.js.consumer_info(dep.names.stream_of(filters[0]), durable)
            if not info.num_waiting:
                return False
        return True

    await eventually(bound, 60, "the services' consumers to be bound", every=0.1)
