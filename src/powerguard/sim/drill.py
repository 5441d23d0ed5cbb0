"""The scripted outage on the simulated site, observed from the bus like an operator would:

utility fails → on battery → checkpoint on every rank → hold (what the job does during it is
its hold policy) → shutdown at the site's hold limit (after a final checkpoint with
``checkpoint-at-stop``) → utility returns → stable → staggered power-on → the job restarts from
its checkpoint → training resumes and finishes → final parameters compared with the reference run.

The report's work-lost figures come from the ranks' own progress file (every step each rank
finished, with its time), not from the saga: a step trained twice is a step lost. The saga's
own figures (from its record in KV) are reported next to them.

Scenarios: ``outage`` (the above), ``flap`` (power returns once every rank has acked, before
any shutdown: the saga is cancelled and no node goes down), ``race`` (power returns while the
nodes are shutting down: the shutdown finishes, then the restore runs), ``blackout`` (the
outage outlasts the battery: the UPS is told to cut its output, the whole site loses power,
PowerGuard included, and comes back by itself: :mod:`.blackout`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from powerguard.bus import Bus
from powerguard.schemas import (
    AgentRegistered,
    CheckpointDurable,
    CheckpointFailed,
    Envelope,
    JobResumed,
    NodeState,
    OnBattery,
    OnLine,
    PowerActionDone,
    PowerActionFailed,
    SagaStateChanged,
)

from .errors import DrillError
from .site import SimSite

SCENARIOS = ("outage", "flap", "race", "real-ups", "fsd", "eval", "blackout")
Notify = Callable[[float, str, str], None]  # (seconds since start, phase, text)


@dataclass
class Observed:
    t0: float
    events: list[tuple[float, Envelope]] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    battery: dict = field(default_factory=dict)  # the UPS when the stop was decided

    def add(self, event: Envelope) -> None:
        self.events.append((time.time(), event))
        self.changed.set()

    def of(self, kind: type[Envelope], pred: Callable[[Envelope], bool] = lambda e: True) -> list[tuple[float, Any]]:
        return [(t, e) for t, e in self.events if isinstance(e, kind) and pred(e)]

    def first(self, kind: type[Envelope], pred: Callable[[Envelope], bool] = lambda e: True) -> float | None:
        hits = self.of(kind, pred)
        return hits[0][0] if hits else None

    def acked(self, job: str) -> set[int]:
        """The ranks of ``job`` acked durable so far (each its own, or rank 0 for the job)."""
        return {r for _, e in self.of(CheckpointDurable, lambda e: e.data.job == job) for r in e.data.speaks_for()}


def _describe(e: Envelope) -> tuple[str, str] | None:
    d = e.data
    if isinstance(e, OnBattery):
        return "detect", f"ups-monitor: {d.ups} on battery (runtime {d.runtime_s or 0:.0f}s, via {d.via})"
    if isinstance(e, OnLine):
        return "detect", f"ups-monitor: {d.ups} back on line"
    if isinstance(e, SagaStateChanged):
        return "saga", f"coordinator: saga {d.state.value}" + (f" ({d.reason})" if d.reason else "")
    if isinstance(e, CheckpointDurable):
        return "checkpoint", f"{d.who()}: checkpoint step {d.step} durable, {d.durability} ({d.bytes / 1e6:.1f} MB)"
    if isinstance(e, CheckpointFailed):
        return "checkpoint", f"rank {d.rank}: checkpoint FAILED: {d.error}"
    if isinstance(e, NodeState):
        return "power", f"{d.node}: {d.state}"
    if isinstance(e, PowerActionDone) and d.action in ("outlet_on", "outlet_off", "on", "off", "soft_off"):
        return "power", f"{d.node}: {d.action} on {d.device} ({d.detail or 'ok'})"
    if isinstance(e, PowerActionFailed):
        return "power", f"{d.node}: {d.action} FAILED: {d.error}"
    if isinstance(e, JobResumed) and d.step is not None:
        return "resume", f"job {d.job}: training resumed from step {d.step}"
    return None


async def _until(obs: Observed, pred: Callable[[], Any], timeout_s: float, what: str, site: SimSite) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (value := pred()):
        dead = [n for n in site.dead() if not n.startswith("bmc")]
        if dead:
            raise DrillError(f"{', '.join(dead)} exited while waiting for {what}; see {site.workdir}/<name>.log")
        left = deadline - time.monotonic()
        if left <= 0:
            raise DrillError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        obs.changed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(obs.changed.wait(), min(left, 0.25))
    return value


def _lines(site: SimSite) -> list[tuple[int, int, float]]:
    """(rank, step, time) of every finished step, in the order the ranks wrote them."""
    out = []
    try:
        for line in site.progress.read_text().splitlines():
            rank, step, at = line.split()
            out.append((int(rank), int(step), float(at)))
    except (OSError, ValueError):
        pass
    return out


def _progress(site: SimSite) -> dict[int, int]:
    """Last completed step per rank."""
    return {rank: step for rank, step, _ in _lines(site)}


def work_figures(lines: list[tuple[int, int, float]], *, step_at_detection: int, stop_at: int | None) -> dict:
    """What the ranks really did, from their progress lines (``stop_at``: how many lines were
    written before the nodes went off, None when they never did)."""
    first = lines[:stop_at] if stop_at is not None else lines
    rank0 = [(s, t) for r, s, t in first if r == 0]
    stop_step = max((s for _, s, _ in first), default=None) if stop_at is not None else None
    # a step a rank finished twice was lost once (the restart trained it again)
    seen: dict[int, set[int]] = {}
    retrained: dict[int, int] = {}
    for r, s, _ in lines:
        if s in seen.setdefault(r, set()):
            retrained[r] = retrained.get(r, 0) + 1
        seen[r].add(s)
    lost = max(retrained.values(), default=0)
    times = dict(rank0)
    lost_s = None
    if stop_step is not None and lost and (stop_step - lost) in times and stop_step in times:
        lost_s = round(times[stop_step] - times[stop_step - lost], 3)
    gaps = [b[1] - a[1] for a, b in itertools.pairwise(rank0) if a[0] >= step_at_detection]
    hold_end = stop_step if stop_step is not None else max((s for s, _ in rank0), default=step_at_detection)
    return {
        "stop_step": stop_step,
        "lost_steps": lost,
        "lost_s": 0.0 if not lost else lost_s,
        "steps_trained_since_detection": None if stop_step is None else stop_step - step_at_detection,
        "steps_kept": None if stop_step is None else max(0, stop_step - step_at_detection - lost),
        "longest_stall_s": round(max(gaps), 3) if gaps else None,
        "trained_after_detection_to": hold_end,
    }


async def run_drill(site: SimSite, scenario: str, *, notify: Notify, bus: Bus, warmup_steps: int = 30) -> dict:
    """Run one scenario on a started site; return the report (without the bit-exact check).

    ``real-ups`` is a fresh site's first outage on a real NUT server (the site's
    ``ups_driver="nut"``; nothing measured before): the UPS's runtime estimate jumps from 600 s
    to 100 s, below the shutdown reserve, and its load jumps, while the job trains. ``fsd`` is
    the same server ordering a forced shutdown (NUT's FSD flag) 10 s into the hold: no time for
    a final checkpoint, the job stops on the newest hold checkpoint. ``eval``: the utility fails
    while the job runs a 20 s evaluation (inside ``guard.quiescent()``): the checkpoint is served
    at once, not after the evaluation."""
    if scenario not in SCENARIOS:
        raise ValueError(f"scenario must be one of {', '.join(SCENARIOS)}")
    world = site.opts.nodes * site.opts.ranks_per_node
    job = site.opts.job
    rounds: list[Observed] = [Observed(t0=time.time())]
    t_start = rounds[0].t0

    def say(phase: str, text: str, at: float | None = None) -> None:
        notify((at or time.time()) - t_start, phase, text)

    conn = {"bus": bus}  # the observer's connection (a new one after a blackout)

    async def watch(bus: Bus) -> None:
        async for event in bus.subscribe(subject=bus.subjects.all, deliver="new"):
            obs = rounds[-1]
            if isinstance(event, SagaStateChanged) and event.data.state.value in ("final_checkpoint", "shutting_down"):
                _snapshot_battery(site, obs.battery, event.data.state.value)
            obs.add(event)
            line = _describe(event)
            if line:
                say(*line)

    watchers = [asyncio.create_task(watch(bus))]

    async def detach() -> None:
        """A blackout is coming: the observer lets go of the broker (it is not part of the site)."""
        for old in watchers:
            old.cancel()
        await asyncio.gather(*watchers, return_exceptions=True)
        await conn["bus"].close()

    async def attach() -> None:
        """After a blackout: a new connection to the restarted broker, watched before any
        service starts."""
        conn["bus"] = await Bus.connect(site.nats_url, service="demo", names=bus.names)
        watchers.append(asyncio.create_task(watch(conn["bus"])))
        await asyncio.sleep(0.3)  # the subscription is bound

    try:
        await asyncio.sleep(0.3)  # the subscription is bound
        # the site's scheduler starts the job (the process adapter power-control restarts it with later);
        # a job start is no power command: nobody but the coordinator may publish those
        await site.start_job()
        say("setup", f"job {job}: {world} ranks on {', '.join(site.node_names)} launched by the site's scheduler")
        earlier: list[dict] = []
        plan = [scenario]
        for i, kind in enumerate(plan):
            obs = rounds[-1]
            await _until(  # a later round: the ranks registered again when the job resumed (the last round)
                obs if i == 0 else rounds[-2],
                lambda o=(obs if i == 0 else rounds[-2]): (
                    len({e.data.rank for _, e in o.of(AgentRegistered, lambda e: e.data.job == job)}) >= world
                ),
                120,
                f"{world} ranks to register",
                site,
            )
            floor = max(_progress(site).values() or [0]) + warmup_steps if i else warmup_steps
            await _until(
                obs,
                lambda floor=floor: min(_progress(site).values() or [0]) >= floor and len(_progress(site)) == world,
                120,
                f"training to reach step {floor}",
                site,
            )
            if scenario == "real-ups":
                site.battery.runtime_trace = REAL_UPS_RUNTIME_TRACE
                site.battery.load_jumps = REAL_UPS_LOAD_JUMPS
                say("outage", "the UPS's runtime estimate will drop from 600 s to 100 s, and its load jump")
            if scenario == "fsd":
                site.battery.runtime_trace = ((0.0, 600.0),)
            if scenario == "eval":
                evals = site.workdir / EVAL_LOG
                await _until(
                    obs,
                    lambda evals=evals: evals.exists() and evals.read_text().count(" start ") >= world,
                    120,
                    "every rank to start its evaluation",
                    site,
                )
                say("outage", "the ranks evaluate (20 s, inside guard.quiescent()): the outage comes now")
            if kind == "blackout":
                from .blackout import blackout_outage

                times = await blackout_outage(
                    site,
                    obs,
                    say=say,
                    job=job,
                    world=world,
                    until=_until,
                    detach=detach,
                    attach=attach,
                    progress=lambda: _progress(site),
                    lines=lambda: _lines(site),
                )
            else:
                times = await _one_outage(site, obs, kind, say=say, job=job, world=world)
            if i < len(plan) - 1:
                earlier.append({"saga_id": _saga_id(obs), "saga": await _saga_figures(bus, _saga_id(obs))})
                rounds.append(Observed(t0=time.time()))
        obs = rounds[-1]
        await _until(obs, lambda: site.final.exists() and not site.job_running(), 240, "training to finish", site)
        stages = times.pop("stages", None)
        report = _report(scenario, obs, site, **times)
        if stages is not None:
            from .blackout import blackout_figures

            report["blackout"] = True
            report.update(blackout_figures(stages, _lines(site), stop_at=times["stop_at"]))
            report["powercut_fs"] = site.powercut_unavailable is None
            if site.powercut_unavailable:
                report["powercut_fs_unavailable"] = site.powercut_unavailable
        report["work"] = work_figures(
            _lines(site),
            step_at_detection=times["step_at_detection"],
            stop_at=None if scenario == "flap" else times["stop_at"],
        )
        del report["stop_at"]
        report["rpo_steps"] = report["work"]["lost_steps"]  # work lost at the stop: steps trained twice
        report["steps_lost"] = report["rpo_steps"]
        report["battery_at_stop"] = obs.battery
        report["saga"] = await _saga_figures(conn["bus"], report["saga_id"])
        if earlier:
            report["earlier_outages"] = earlier
        return report
    finally:
        for w in watchers:
            w.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await w
        if conn["bus"] is not bus:
            await conn["bus"].close()  # the drill's own (the caller's was closed at the blackout)


# ``real-ups`` (UPS seconds on battery -> what the UPS reports from then on)
REAL_UPS_RUNTIME_TRACE = ((0.0, 600.0), (3.0, 100.0))
REAL_UPS_LOAD_JUMPS = ((1.5, 20.0),)
FSD_AFTER_HOLD_S = 10.0  # ``fsd``: the UPS orders a forced shutdown this long into the hold
EVAL_LOG = "eval.txt"  # ``eval``: where the job notes its evaluations (in the site's work directory)


def _saga_id(obs: Observed) -> str | None:
    saga = obs.of(SagaStateChanged)
    return saga[0][1].data.saga_id if saga else None


def _snapshot_battery(site: SimSite, battery: dict, why: str) -> None:
    if battery:
        return
    from .ups import full_runtime_s

    b = site.battery
    battery.update(
        at=why,
        runtime_s=round(b.runtime_s, 1),
        charge_pct=round(b.charge_pct, 2),
        load_pct=round(b.total_load(), 1),
        runtime_at_training_load_s=round(
            b.charge_pct / 100 * full_runtime_s(site.opts.load_per_node_pct * site.opts.nodes) / b.speed, 1
        ),
    )


async def _one_outage(site: SimSite, obs: Observed, scenario: str, *, say, job: str, world: int) -> dict:
    """Utility fails, the saga runs its course, utility returns; the times of its phases."""
    t_fail = time.time()
    site.utility(on=False)
    say("outage", "utility power FAILS: the UPS is on battery", t_fail)
    t_det = await _until(obs, lambda: obs.first(OnBattery), 30, "on_battery", site)
    step_at_detection = max(_progress(site).values())
    acked = lambda: len(obs.acked(job)) >= world  # noqa: E731
    await _until(obs, acked, 90, "every rank's checkpoint ack", site)
    t_acked = max(t for t, _ in obs.of(CheckpointDurable, lambda e: e.data.job == job))
    saga_state = lambda *states: obs.first(SagaStateChanged, lambda e: e.data.state.value in states)  # noqa: E731
    stop_at = None
    if scenario == "flap":
        await _until(obs, lambda: saga_state("holding", "checkpointed"), 30, "the saga to hold", site)
        await asyncio.sleep(2.0)  # a short hold: the job trains on (continue, checkpoint-at-stop) or waits (pause)
        _snapshot_battery(site, obs.battery, "power back")
        t_ret = time.time()
        site.utility(on=True)
        say("outage", "utility power RETURNS before any shutdown (a flap)", t_ret)
        await _until(obs, lambda: saga_state("cancelled", "done", "failed"), 60, "the saga to end", site)
    else:
        if scenario == "race":
            await _until(
                obs,
                lambda: obs.first(NodeState, lambda e: e.data.state == "shutting_down"),
                60,
                "the shutdown to start",
                site,
            )
            t_ret = time.time()
            site.utility(on=True)
            say("outage", "utility power RETURNS while the nodes are shutting down (a race)", t_ret)

        def off() -> bool:
            nodes = {e.data.node for _, e in obs.of(NodeState, lambda e: e.data.state == "off")}
            return len(nodes) >= len(site.node_names)

        if scenario == "fsd":
            await _until(obs, lambda: saga_state("holding"), 30, "the saga to hold", site)
            await asyncio.sleep(FSD_AFTER_HOLD_S)  # the hold trains on (and checkpoints), then the UPS orders FSD
            site.battery.fsd = True
            say("outage", f"the UPS orders a forced shutdown (FSD) {FSD_AFTER_HOLD_S:.0f} s into the hold")
        await _until(obs, off, 90, "every node off", site)
        stop_at = len(_lines(site))
        if site.final.exists():
            raise DrillError("training finished before the shutdown: run more --steps")
        if scenario in ("outage", "real-ups", "fsd", "eval"):
            await asyncio.sleep(1.0)
            t_ret = time.time()
            site.utility(on=True)
            say("outage", "utility power RETURNS", t_ret)
        await _until(obs, lambda: saga_state("done", "failed"), 180, "the restore to finish", site)
    site.battery.runtime_trace, site.battery.load_jumps, site.battery.fsd = (), (), False
    return {
        "t_fail": t_fail,
        "t_det": t_det,
        "t_acked": t_acked,
        "t_ret": t_ret,
        "step_at_detection": step_at_detection,
        "stop_at": stop_at,
    }


async def _saga_figures(bus: Bus, saga_id: str | None) -> dict | None:
    """The coordinator's own account of the outage (its published status)."""
    from powerguard.bus.saga_status import saga_statuses

    for status in await saga_statuses(bus, include_closed=True):
        if status.saga == saga_id:
            s = status.row()
            keys = ("state", "lost_steps", "hold_s", "stop_reason", "runtime_at_stop_s", "jobs", "ups_off")
            return {k: s.get(k) for k in keys}
    return None


def _report(
    scenario: str,
    obs: Observed,
    site: SimSite,
    *,
    t_fail: float,
    t_det: float,
    t_acked: float,
    t_ret: float,
    step_at_detection: int,
    stop_at: int | None = None,
) -> dict:
    job = site.opts.job
    off = [t for t, e in obs.of(NodeState, lambda e: e.data.state == "off")]
    ready = [t for t, e in obs.of(NodeState, lambda e: e.data.state == "ready")]
    resumed = obs.of(JobResumed, lambda e: e.data.job == job and e.data.step is not None)
    saga = obs.of(SagaStateChanged)
    restored_step = resumed[-1][1].data.step if resumed else None
    durable = obs.of(CheckpointDurable, lambda e: e.data.job == job)
    acked_steps = sorted({e.data.step for _, e in durable})

    def action(e: CheckpointDurable) -> str:  # what the ack answers: <saga>/<job>/<ckpt|final|hold.N>
        return (e.data.request_id or "").rsplit("/", 1)[-1]

    failures = sorted(
        {(e.data.rank, action(e), e.data.error) for _, e in obs.of(CheckpointFailed, lambda e: e.data.job == job)}
    )
    finals = sorted({e.data.step for _, e in durable if action(e) == "final"})
    holds = sorted({e.data.step for _, e in durable if action(e).startswith("hold.")})
    return {
        "scenario": scenario,
        "hold_policy": site.opts.hold_policy,
        "saga_id": saga[0][1].data.saga_id if saga else None,
        "saga_states": [e.data.state.value for _, e in saga],
        "detected_s": round(t_det - t_fail, 3),
        "all_acked_s": round(t_acked - t_fail, 3),
        # when the last rank sent its last ack (its own event time: before anything it caused)
        "last_ack_time": max(e.time for _, e in durable).isoformat() if durable else None,
        "nodes_off_s": round(max(off) - t_fail, 3) if off else None,
        "nodes_powered_off": len({e.data.node for _, e in obs.of(NodeState, lambda e: e.data.state == "off")}),
        "power_restored_s": round(max(ready) - t_ret, 3) if ready and off else None,
        "training_resumed_s": round(resumed[-1][0] - t_ret, 3) if resumed and off else None,
        "step_at_detection": step_at_detection,
        "checkpoint_step": acked_steps[0] if acked_steps else None,
        "final_checkpoint_step": finals[-1] if finals else None,
        "hold_checkpoint_steps": holds,
        # a rank that answered a request with a failure (a deadline the loop missed: a long
        # evaluation outside guard.quiescent()), even when a later round made up for it
        "checkpoint_failures": [{"rank": r, "request": a, "error": err} for r, a, err in failures],
        "restored_step": restored_step,
        "local_scope": site.opts.local_scope,
        "durability": {
            str(step): sorted({e.data.durability for _, e in durable if e.data.step == step}) for step in acked_steps
        },
        "restarted": restored_step is not None,
        "nodes_on_at_end": sum(site.node_on(n) for n in site.node_names),
        "events": len(obs.events),
        "stop_at": stop_at,
    }
