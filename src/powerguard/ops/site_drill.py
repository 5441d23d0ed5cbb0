"""``powerguard drill --site site.yaml --ups UPS --dry-run``: test the outage path of a real site.

Like ``upsmon -c fsd`` with a dummy SHUTDOWNCMD, but with real acknowledgments: a synthetic
on-battery (marked ``drill``) for one UPS starts the real saga in the running coordinator; the
real agents of every job on the nodes that UPS feeds take a real checkpoint and ack it; the
battery is drained in synthetic ``status`` events (``speed`` UPS seconds per second, from the
runtime the UPS last reported); the saga decides the shutdown and sends its commands with
``dry_run`` set, so power-control only reports what it would do; then a synthetic on-line lets
the saga run its (dry-run) restore. The result is the plan as executed and a budget check:
slowest job's checkpoint vs. the checkpoint budget vs. the time left before the shutdown.

An operator tool: it knows the coordinator only from what the coordinator publishes (the site's
and the drill saga's status, schemas/status.py: the nodes a UPS alone feeds, the battery budget
and the runtime at which the saga stops the jobs, by the coordinator's own rules) and its events.

A drill lives apart from reality: its readings have their own subject and their own views in
the coordinator, and its saga never holds a real node. A real outage during a drill gets its own
real saga, and the drill ends ``cancelled`` (its paused ranks released); a real saga open on the
UPS's nodes leaves the drill nothing at risk.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from powerguard.bus import Bus
from powerguard.bus.saga_status import saga_status, site_status
from powerguard.schemas import (
    AgentData,
    CheckpointDurable,
    CheckpointFailed,
    ConfigError,
    Envelope,
    JobRestartRequested,
    JobStopRequested,
    OnBattery,
    OnLine,
    PowerActionDone,
    PowerData,
    PowerEvent,
    PowerOnRequested,
    PowerStatus,
    SagaState,
    SagaStateChanged,
    ShutdownRequested,
    SiteConfig,
)

SOURCE = "/powerguard/drill"
STATUS_WAIT_S = 5.0  # the drill saga's first status, after its first state event
Notify = Callable[[float, str], None]


@dataclass
class DrillResult:
    saga_id: str | None = None
    states: list[str] = field(default_factory=list)
    runtime_s: float = 0.0
    load_pct: float | None = None
    budget_s: float | None = None  # the saga's battery budget as it started (its published status)
    notes: list[str] = field(default_factory=list)  # what the drill could not learn
    shutdown_after_s: float = 0.0
    acks: dict[str, dict[int, float]] = field(default_factory=dict)  # job -> rank -> seconds after on_battery
    # the final checkpoint of checkpoint-at-stop (a second round): job -> rank -> seconds after its request
    final_acks: dict[str, dict[int, float]] = field(default_factory=dict)
    final_at_s: float | None = None
    failed: dict[str, dict[int, str]] = field(default_factory=dict)
    expected: dict[str, int] = field(default_factory=dict)  # job -> world size
    commands: list[str] = field(default_factory=list)
    shutdown_at_s: float | None = None
    not_dry: list[str] = field(default_factory=list)
    hold_policy: str = "checkpoint-at-stop"
    stop_after_s: float | None = None  # when the jobs stop on a real outage, given the measured checkpoint
    lost_steps: dict[str, int] = field(default_factory=dict)  # job -> steps lost at the stop (the saga's figures)
    stop_reason: str | None = None  # the saga's reason for the shutdown (a skipped final checkpoint says why)

    @property
    def slowest_s(self) -> float | None:
        times = [t for ranks in self.acks.values() for t in ranks.values()]
        return max(times) if times else None

    @property
    def complete(self) -> bool:
        return all(len(self.acks.get(j, {})) == n for j, n in self.expected.items())

    @property
    def problems(self) -> list[str]:
        """Why the drill is not OK, one line each (empty: OK)."""
        out: list[str] = []
        if not self.expected:
            out.append(
                "no job on the nodes at risk has a registered agent: nothing was checkpointed (is a job running "
                "with the ckpt-agent and its POWERGUARD_* environment?)"
            )
        for job, n in sorted(self.expected.items()):
            missing = [r for r in range(n) if r not in self.acks.get(job, {})]
            if missing:
                out.append(f"{job}: ranks {','.join(map(str, missing))} did not ack")
        for job, ranks in sorted(self.failed.items()):
            out += [f"{job} rank {r}: checkpoint failed: {e}" for r, e in sorted(ranks.items())]
        if self.not_dry:
            out.append(f"{len(self.not_dry)} command(s) NOT dry-run: {', '.join(self.not_dry)}")
        out += self.notes
        slowest = self.slowest_s
        if slowest is not None and self.budget_s is not None and slowest > self.budget_s:
            out.append(f"the slowest checkpoint took {slowest:.1f}s, over the {self.budget_s:.1f}s budget")
        if self.hold_policy == "checkpoint-at-stop":
            for job, lost in sorted(self.lost_steps.items()):
                if lost:
                    why = (
                        f" ({self.stop_reason})" if self.stop_reason and "final checkpoint" in self.stop_reason else ""
                    )
                    out.append(f"{job} lost {lost} step(s) at the stop under checkpoint-at-stop{why}")
        if not self.states:
            out.append("no saga state was seen")
        elif self.states[-1] != "done":
            out.append(f"the saga ended {self.states[-1]}")
        return out

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        return {
            "saga_id": self.saga_id,
            "states": self.states,
            "runtime_s": self.runtime_s,
            "load_pct": self.load_pct,
            "checkpoint_budget_s": None if self.budget_s is None else round(self.budget_s, 1),
            "shutdown_after_s": round(self.shutdown_after_s, 1),
            "hold_policy": self.hold_policy,
            "stop_after_s": None if self.stop_after_s is None else round(self.stop_after_s, 1),
            "slowest_checkpoint_s": None if self.slowest_s is None else round(self.slowest_s, 3),
            "final_checkpoint_s": max((t for r in self.final_acks.values() for t in r.values()), default=None),
            "acks": {j: {str(r): round(t, 3) for r, t in ranks.items()} for j, ranks in self.acks.items()},
            "failed": self.failed,
            "expected_ranks": self.expected,
            "commands": self.commands,
            "commands_not_dry_run": self.not_dry,
            "lost_steps": self.lost_steps,
            "problems": self.problems,
            "ok": self.ok,
        }


async def last_reading(bus: Bus, site: str, ups: str, timeout_s: float = 3.0) -> PowerData | None:
    """The UPS's last power event or telemetry on the bus, if any."""
    sub = bus.subscribe(PowerEvent, subject=bus.subjects.power(site, ups), deliver="last")
    try:
        return (await asyncio.wait_for(sub.__anext__(), timeout_s)).data
    except (TimeoutError, StopAsyncIteration):
        return None
    finally:
        await sub.aclose()


async def jobs_at_risk(bus: Bus, nodes: set[str]) -> dict[str, int]:
    """job -> world size, for the registered agents on these nodes."""
    jobs: dict[str, int] = {}
    for entry in await (await bus.agents()).items():
        try:
            agent = AgentData.model_validate(entry.json())
        except ValueError:
            continue
        if agent.node in nodes:
            jobs[agent.job] = agent.world_size
    return jobs


async def run_site_drill(
    bus: Bus,
    site: SiteConfig,
    ups: str,
    *,
    notify: Notify,
    runtime_s: float | None = None,
    load_pct: float | None = None,
    speed: float = 1.0,
    timeout_s: float = 900.0,
    status_wait_s: float = 15.0,
) -> DrillResult:
    """``status_wait_s``: how long to wait for the site's status when no coordinator has
    published it yet (one that is starting takes the lead within its lease's time)."""
    published = await site_status(bus, site.site)
    until = time.monotonic() + status_wait_s
    while published is None and time.monotonic() < until:
        await asyncio.sleep(0.2)
        published = await site_status(bus, site.site)
    if published is None:
        raise ConfigError(
            f"no coordinator has published the status of site {site.site} (pg_status) within {status_wait_s:.0f}s: "
            "is the coordinator running and leading the site?"
        )
    if ups not in published.ups_alone:
        ups_list = ", ".join(sorted(published.ups_alone))
        raise ConfigError(f"UPS {ups!r} feeds no node in the site file (UPSes: {ups_list})")
    nodes = set(published.ups_alone[ups])
    if not nodes:
        raise ConfigError(f"no node depends on {ups} alone (every node it feeds has another feed): nothing to drill")
    result = DrillResult()
    # the UPS's own load (and runtime, unless given): what its last reading on the bus says
    reading = await last_reading(bus, site.site, ups) if runtime_s is None or load_pct is None else None
    if load_pct is None and reading is not None:
        load_pct = reading.load_pct
    if runtime_s is None:
        if reading is None or reading.runtime_s is None:
            raise ConfigError(f"no runtime reading of {ups} on the bus (is ups-monitor running?); pass --runtime-s")
        runtime_s = reading.runtime_s
    result.runtime_s, result.load_pct = runtime_s, load_pct
    result.hold_policy = published.hold_policy
    result.expected = await jobs_at_risk(bus, nodes)
    t0 = time.time()

    def data(on_battery: bool, runtime: float) -> PowerData:
        return PowerData(
            site=site.site,
            ups=ups,
            on_battery=on_battery,
            runtime_s=max(0.0, runtime),
            load_pct=load_pct,
            status=["OB", "DISCHRG"] if on_battery else ["OL"],
            driver="drill",
            drill=True,
            seconds_on_battery=(time.time() - t0) * speed if on_battery else 0,
        )

    done = asyncio.Event()
    restored = asyncio.Event()

    async def started(saga_id: str) -> None:
        """The saga's battery budget and stop point as it started, from its first published
        status (written as the saga's first state is announced)."""
        until = time.monotonic() + STATUS_WAIT_S
        while time.monotonic() < until:
            status = await saga_status(bus, saga_id)
            if status is not None and status.budget_s is not None and status.stop_at_runtime_s is not None:
                result.budget_s = status.budget_s
                result.shutdown_after_s = max(0.0, (runtime_s - status.stop_at_runtime_s) / speed)
                return
            await asyncio.sleep(0.1)
        result.budget_s = 0.0
        result.notes.append(f"saga {saga_id}: no status published within {STATUS_WAIT_S:.0f}s (pg_status)")

    async def watch() -> None:
        subjects = bus.subjects
        async for ev in bus.subscribe(subject=subjects.all, deliver="new"):
            _observe(ev, result, t0, notify)
            if result.budget_s is None and result.saga_id is not None:
                await started(result.saga_id)
            if isinstance(ev, SagaStateChanged) and ev.data.saga_id == result.saga_id:
                if ev.data.state.down or ev.data.state == SagaState.CANCELLED:
                    restored.set()
                if ev.data.state.terminal:
                    done.set()

    watcher = asyncio.create_task(watch())
    try:
        await asyncio.sleep(0.3)
        await bus.publish(OnBattery(source=SOURCE, subject=ups, data=data(True, runtime_s)))
        notify(
            0.0,
            f"synthetic on-battery for {ups}: runtime {runtime_s:.0f}s at load {load_pct or '?'}%, "
            f"drained at {speed:g}x",
        )
        deadline = time.monotonic() + timeout_s
        while not restored.is_set():
            if time.monotonic() > deadline:
                raise TimeoutError(f"the saga did not shut down within {timeout_s:.0f}s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(restored.wait(), 1.0)
            if not restored.is_set():
                left = runtime_s - (time.time() - t0) * speed
                await bus.publish(PowerStatus(source=SOURCE, subject=ups, data=data(True, left)))

        await bus.publish(OnLine(source=SOURCE, subject=ups, data=data(False, runtime_s)))
        notify(time.time() - t0, f"synthetic on-line for {ups}: the saga restores (dry-run)")
        await asyncio.wait_for(done.wait(), max(1.0, deadline - time.monotonic()))
        status = await saga_status(bus, result.saga_id) if result.saga_id is not None else None
        if result.slowest_s is not None and status is not None and status.stop_at_runtime_s is not None:
            # with a measured checkpoint the stop leaves time for the final
            result.stop_after_s = max(0.0, (runtime_s - status.stop_at_runtime_s) / speed)
        return result
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher


def _observe(ev: Envelope, r: DrillResult, t0: float, notify: Notify, *, now: float | None = None) -> None:
    at = (time.time() if now is None else now) - t0
    if isinstance(ev, SagaStateChanged):
        if r.saga_id is None and ev.data.drill:  # the drill's saga, never a real outage's beside it
            r.saga_id = ev.data.saga_id
        if ev.data.saga_id == r.saga_id:
            r.states.append(ev.data.state.value)
            if ev.data.lost_steps:
                r.lost_steps = dict(ev.data.lost_steps)
            if ev.data.state.value == "shutting_down":
                r.shutdown_at_s, r.stop_reason = at, ev.data.reason
            if ev.data.state.value == "final_checkpoint":
                r.final_at_s = at
            notify(at, f"saga {ev.data.state.value}" + (f": {ev.data.reason}" if ev.data.reason else ""))
    elif isinstance(ev, CheckpointDurable | CheckpointFailed) and ev.data.saga_id == r.saga_id:
        d = ev.data
        if isinstance(ev, CheckpointDurable):
            for rank in d.speaks_for():  # a rank's own ack, or rank 0's for the job
                if r.final_at_s is None:  # the first round: measured from on-battery, against the budget
                    r.acks.setdefault(d.job, {})[rank] = at
                else:  # the final checkpoint: measured from its request, never mixed into the first round
                    r.final_acks.setdefault(d.job, {})[rank] = at - r.final_at_s
            notify(at, f"{d.job} {d.who()}: checkpoint step {d.step} durable")
        else:
            r.failed.setdefault(d.job, {})[d.rank] = d.error
            notify(at, f"{d.job} rank {d.rank}: checkpoint FAILED: {d.error}")
    elif isinstance(ev, ShutdownRequested | PowerOnRequested | JobStopRequested | JobRestartRequested):
        if ev.data.saga_id != r.saga_id:
            return
        target = ev.data.job if isinstance(ev, JobStopRequested | JobRestartRequested) else ev.data.node
        what = f"{ev.type.rsplit('.', 1)[-1]} {target}" + (" (dry-run)" if ev.data.dry_run else " (REAL)")
        r.commands.append(what)
        if not ev.data.dry_run:
            r.not_dry.append(what)
        notify(at, f"command: {what}")
    elif isinstance(ev, PowerActionDone) and ev.data.saga_id == r.saga_id and ev.data.dry_run:
        notify(at, f"power-control would: {ev.data.action} {ev.data.device or ev.data.node}")
