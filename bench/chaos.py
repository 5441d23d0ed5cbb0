"""A randomized fault campaign: the simulated site's outage drill (real nats-server, real
ups-monitor, coordinator and power-control processes, simulated UPS/PDU/BMCs, a real 2-node x
2-rank torch job) run again and again with one fault at a random moment, restarting what was
killed the way a supervisor does, then checked against the invariants below from the event
stream and the simulated devices. Writes bench/results/chaos.json.

    python bench/chaos.py --runs 100 --seed 1      # make chaos
    python bench/chaos.py --replay 17              # one run again, by its seed

Faults: SIGKILL of the coordinator, power-control or ups-monitor (restarted 0.5-3 s later) in
the hold, the shutdown or the restore; a nats-server restart; on a 3-node cluster (R3), SIGKILL of
the node that leads the event stream; a BMC unreachable for a while; the UPS agent silent (SNMP
timeouts) or answering out-of-range values (charge 255 %, load 999 %); one training rank
SIGKILLed in the hold; the checkpoint disk full (a small tmpfs filled to the last byte) from the
outage on; power flapping back during the hold; one service's wall clock off by 5-60 s from the
start (libfaketime); none. And the whole site losing its power, PowerGuard's own included (the
broker's store and the checkpoint disks on the power-cut filesystem, every process SIGKILLed):
``blackout`` (the outage outlasts the battery: the coordinator tells the UPS to cut its output,
and the output going off is the cut) and ``cut-during-checkpoint`` (the battery gives out early, a
runtime estimate that was wrong: the cut lands at a random instant of the power checkpoint, or
of the final checkpoint or the shutdown); mains returns 0.5-3 s later and the site must come
back by itself (each BMC boots its node by its restore policy, the services start at boot).
``mgmt-cut``: the management host (the broker and every service) SIGKILLed and back 0.5-3 s later,
and utility fails 0.2-2 s after that (the registry, in the broker's memory, is empty then).

Invariants (a violation names the run's seed):
  shutdown_after_acks   no node is told to shut down before every rank acked or the deadline passed
  one_saga              one outage, one saga (none from a redelivered or late event)
  nodes_on              every node is on after power returned
  no_double_cycle       no node is power-cycled more than once (no action executed twice); after a
                        power cut of the site, no BMC command sent twice (the cut itself and the
                        BMC's restore policy cycle every node once more: the site's, not ours)
  resumed_from_commit   training finished, restored from a committed step >= the newest step every
                        rank acked as durable (an ack is a promise that survives any later cut)
  saga_terminal         the saga ended (done, or cancelled for a flap), not failed or stuck
  no_unplanned_exit     no service died except by an injected kill
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results"
KINDS = (
    "none",
    "kill:coordinator",
    "kill:power-control",
    "kill:ups-monitor",
    "nats-restart",
    "bmc-down",
    "kill-rank",
    "flap",
    "nats-leader-loss",
    "ups-bad",
    "disk-full",
    "clock-offset",
    "blackout",
    "cut-during-checkpoint",
    "mgmt-cut",
)
FIRST_KINDS = KINDS[:8]  # what the campaign drew from before the last four were added (replay: --kinds first)
TWELVE_KINDS = KINDS[:12]  # before the power cuts were added (replay: --kinds twelve)
FOURTEEN_KINDS = KINDS[:14]  # before the management host's cut was added (replay: --kinds fourteen)
CUTS = {"blackout", "cut-during-checkpoint"}  # the whole site loses its power
PHASES = {
    "hold": ("holding", "checkpointed", "partial"),
    "shutdown": ("shutting_down",),
    "restore": ("restoring",),
    "checkpoint": ("checkpointing",),  # the power checkpoint being written
    "stop": ("final_checkpoint", "shutting_down"),  # the final checkpoint (or, without one, the shutdown)
    "ups-off": (),  # the UPS's output going off (blackout)
}
AT_START = {"clock-offset"}  # present from the site's start: the table counts them apart
SERVICES = ("coordinator", "power-control", "ups-monitor")
POLICIES = ("checkpoint-at-stop", "pause", "continue")
TERMINAL = ("done", "cancelled", "failed")


@dataclass
class Fault:
    kind: str
    phase: str
    delay_s: float  # how long the killed or unreachable part stays away
    target: str = ""
    offset_s: float = 0.0  # clock-offset: how far the target's wall clock is off; a cut: how far into its phase

    @classmethod
    def draw(cls, rng: random.Random, kinds: tuple[str, ...] = KINDS) -> Fault:
        kind = rng.choice(kinds)
        fixed = {
            "kill-rank": "hold",
            "flap": "hold",
            "none": "hold",
            "disk-full": "hold",
            "clock-offset": "start",
            "blackout": "ups-off",
            "mgmt-cut": "before",
        }
        phase = (
            fixed.get(kind)
            or (rng.choice(("checkpoint", "stop")) if kind == "cut-during-checkpoint" else None)
            or rng.choice(("hold", "shutdown", "restore"))
        )
        target = f"node{rng.randint(1, 2)}" if kind == "bmc-down" else ""
        delay = round(rng.uniform(0.5, 3.0), 2)
        if kind == "ups-bad":
            target = rng.choice(("silent", "garbage"))
        offset = 0.0
        if kind == "clock-offset":
            target = rng.choice(SERVICES)
            offset = round(rng.choice((-1, 1)) * rng.uniform(5.0, 60.0), 1)
        if kind == "cut-during-checkpoint":  # how far into the phase the power goes
            offset = round(rng.uniform(0.0, 0.6), 3)
        if kind == "mgmt-cut":  # utility fails this long after the management host is back
            offset = round(rng.uniform(0.2, 2.0), 2)
        return cls(kind, phase, delay, target, offset)


@dataclass
class Run:
    seed: int
    policy: str
    fault: Fault
    injected_at: str | None = None
    violations: list[str] = field(default_factory=list)
    saga_states: list[str] = field(default_factory=list)
    checkpoint_step: int | None = None
    restored_step: int | None = None
    evidence: str = ""  # what the event stream shows of the fault (it took effect)
    wall_s: float = 0.0


async def one(
    seed: int,
    work: Path,
    *,
    steps: int = 250,
    kinds: tuple[str, ...] = KINDS,
    fault: Fault | None = None,
    policy: str | None = None,
    budget_s: float | None = None,
) -> Run:
    """One drill with one fault and hold policy, drawn from ``seed`` (or this ``fault`` and
    ``policy``); returns what happened and what broke. ``budget_s``: every wait of the drill
    together ends by then (a test's timeout: a stuck drill reports what it waited for)."""
    from powerguard.bus import Bus, BusNames
    from powerguard.schemas import CheckpointDurable, SagaStateChanged, ShutdownRequested
    from powerguard.sim.drill import _progress
    from powerguard.sim.site import SimSite, SiteOptions

    rng = random.Random(seed)
    run = Run(seed=seed, policy=rng.choice(POLICIES), fault=Fault.draw(rng, kinds))
    if fault is not None:
        run.fault = fault
    if policy is not None:
        run.policy = policy
    t0 = time.monotonic()
    end = None if budget_s is None else t0 + budget_s
    f = run.fault
    site = SimSite(
        work,
        SiteOptions(
            seed=seed,
            steps=steps,
            hold_policy=run.policy,
            nats_nodes=3 if f.kind == "nats-leader-loss" else 1,
            clock_offset={f.target: f.offset_s} if f.kind == "clock-offset" else {},
            ckpt_disk_mb=16 if f.kind == "disk-full" else 0,
            blackout=f.kind in CUTS,
        ),
    )
    events: list[tuple[float, object]] = []
    seen_ids: set[str] = set()  # after a cut the watch starts again from the stream's start
    bus = None
    killed: set[str] = set()

    def states() -> list[tuple[float, str, str]]:
        return [(t, e.data.saga_id, e.data.state.value) for t, e in events if isinstance(e, SagaStateChanged)]

    def reached(*wanted: str) -> bool:
        return any(s in wanted for _, _, s in states())

    async def until(pred, timeout: float, what: str) -> bool:
        limit = timeout if end is None else max(0.0, min(timeout, end - time.monotonic()))
        deadline = time.monotonic() + limit
        while not pred():
            if time.monotonic() > deadline:
                spent = " (the drill's budget spent)" if limit < timeout else ""
                run.violations.append(f"stuck: {what} within {limit:.0f}s{spent}")
                return False
            await asyncio.sleep(0.1)
        return True

    async def watch() -> None:
        async for ev in bus.subscribe(subject=bus.subjects.all, deliver="all"):
            if ev.id not in seen_ids:
                seen_ids.add(ev.id)
                events.append((time.time(), ev))

    async def cut() -> None:
        """The whole site loses its power at the fault's moment; mains returns ``delay_s`` later
        and the site boots: the PDU, each BMC by its restore policy, the broker, the services."""
        nonlocal bus, watcher
        if f.kind == "blackout":
            await until(lambda: not site.output.is_on(), 240, "the UPS's output to go off")
        else:
            await until(lambda: reached(*PHASES[f.phase]), 240, f"phase {f.phase} for the cut")
            await asyncio.sleep(f.offset_s)
        run.injected_at = next((s for _, _, s in reversed(states())), None)
        watcher.cancel()
        with contextlib.suppress(BaseException):
            await watcher
        await bus.close()
        site.power_lost()
        run.evidence = "power-cut filesystem" if site.disks else f"SIGKILL alone ({site.powercut_unavailable})"
        await asyncio.sleep(f.delay_s)
        site.utility(on=True)
        await until(site.output.is_on, 30, "the UPS's output on again")
        site.power_returned()
        bus = await Bus.connect(site.nats_url, service="chaos", names=BusNames(), setup=False)
        watcher = asyncio.create_task(watch())
        site.start_services()

    async def inject() -> None:
        if f.kind in ("none", "flap", "mgmt-cut") or f.kind in CUTS:
            return
        if f.kind in AT_START:
            run.injected_at = "start"
            return
        if f.kind == "disk-full":  # from the moment power fails: the power checkpoint meets a full disk
            run.injected_at = "on_battery"
            site.fill_ckpt_disk()
            await asyncio.sleep(f.delay_s * 3)
            site.free_ckpt_disk()
            return
        await until(lambda: reached(*PHASES[f.phase]), 240, f"phase {f.phase} for the fault")
        run.injected_at = next((s for _, _, s in reversed(states())), None)
        if f.kind.startswith("kill:"):
            name = f.kind.split(":", 1)[1]
            killed.add(name)
            site.kill(name)
            await asyncio.sleep(f.delay_s)
            site.respawn(name)
        elif f.kind == "nats-restart":
            site.nats.stop()
            await asyncio.sleep(f.delay_s)
            site.nats.start()
        elif f.kind == "nats-leader-loss":
            leader = await site.stream_leader()
            leader.kill()
            await asyncio.sleep(f.delay_s * 2)
            leader.start()
            try:
                after = (await site.stream_leader()).extra_args[1]
            except Exception as exc:  # evidence only: the drill and its invariants go on
                after = f"unknown ({type(exc).__name__})"
            run.evidence = f"stream leader {leader.extra_args[1]} killed; leader now {after}"
        elif f.kind == "ups-bad" and f.target == "silent":
            await site.ups_silent(f.delay_s * 3)
        elif f.kind == "ups-bad":
            site.ups_garbage(True)
            await asyncio.sleep(f.delay_s * 3)
            site.ups_garbage(False)
        elif f.kind == "bmc-down":
            site.kill(f"bmc-{f.target}")
            await asyncio.sleep(f.delay_s * 3)
            site.respawn(f"bmc-{f.target}")
        elif f.kind == "kill-rank":
            _kill_a_rank(site)

    watcher = injector = None
    try:
        await site.start()
        bus = await Bus.connect(site.nats_url, service="chaos", names=BusNames(), setup=False)
        watcher = asyncio.create_task(watch())
        await site.start_job()
        world = site.opts.nodes * site.opts.ranks_per_node
        ok = await until(lambda: len(_progress(site)) == world and min(_progress(site).values()) >= 30, 180, "warm-up")
        if ok:
            if f.kind == "mgmt-cut":  # broker and services cut and back seconds before the outage
                run.injected_at = "before on_battery"
                killed.update(SERVICES)
                site.management_host_lost()
                await asyncio.sleep(f.delay_s)
                site.management_host_back()
                await asyncio.sleep(f.offset_s)
                run.evidence = f"management host cut for {f.delay_s}s, utility failed {f.offset_s}s after it was back"
            injector = asyncio.create_task(inject())
            t_fail = time.time()
            site.utility(on=False)
            if run.fault.kind in CUTS:
                await cut()
            elif run.fault.kind == "flap":
                await until(lambda: reached(*PHASES["hold"]), 120, "the hold")
                await asyncio.sleep(1.0 + run.fault.delay_s)
                site.utility(on=True)
            else:
                await until(lambda: all(not site.node_on(n) for n in site.node_names), 180, "every node off")
                await asyncio.sleep(1.0)
                site.utility(on=True)
            t_back = time.time()
            await until(lambda: reached(*TERMINAL), 240, "the saga to end")
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(injector, 30)
            if not await until(lambda: site.final.exists() and not site.job_running(), 300, "training to finish"):
                run.violations.append(await _job_left(site))
            await asyncio.sleep(1.5)  # late events: a redelivered one would start a saga now
            _check(run, site, events, states(), killed, t_fail, t_back, world, CheckpointDurable, ShutdownRequested)
            if not run.evidence:
                run.evidence = _evidence(f, events)
    except Exception as exc:  # a drill that cannot even run is a finding too
        run.violations.append(f"error: {type(exc).__name__}: {exc}")
    finally:
        for task in (injector, watcher):
            if task is not None:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        if bus is not None:
            with contextlib.suppress(Exception):
                await bus.close()
        await site.stop()
    run.saga_states = [s for _, _, s in states()]
    run.wall_s = round(time.monotonic() - t0, 1)
    return run


async def _job_left(site) -> str:
    """What is left of a job that did not finish: its processes (state, command) and, from its
    ranks (sim.train dumps its threads' stacks on SIGUSR1), the end of the job's log."""
    from powerguard.sim.launch import descendants

    if (pid := site.job_pid()) is None:
        return "job: no pid file"
    log = site.workdir / "job.log"
    before = log.stat().st_size if log.exists() else 0
    rows, ranks = [], []
    for p in [pid, *descendants(pid)]:
        try:
            state = (Path("/proc") / str(p) / "stat").read_text().rsplit(")", 1)[1].split()[0]
            cmd = (Path("/proc") / str(p) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        rows.append(f"{p} {state} {cmd[:120]}")
        if "powerguard.sim.train" in cmd.split():  # sim.train's ranks (the other sims have no dump)
            ranks.append(p)
    for p in ranks:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGUSR1)
    new = b""
    for _ in range(30):  # each rank's dump ("Current thread ...") lands within a moment; one stuck in C may not
        await asyncio.sleep(0.1)
        new = log.read_bytes()[before:] if log.exists() else b""
        if new.count(b"Current thread") >= len(ranks):
            break
    tail = new[-6000:].decode(errors="replace")
    return "job left running:\n" + "\n".join(rows) + ("\nits ranks' stacks:\n" + tail if tail else "")


def _evidence(f: Fault, events: list[tuple[float, object]]) -> str:
    """What the event stream shows of a fault that leaves no process dead (it took effect)."""
    from powerguard.schemas import CheckpointFailed, CommLost, NodeState, PowerEvent, SagaStateChanged

    if f.kind == "ups-bad" and f.target == "garbage":
        return f"{sum(isinstance(e, PowerEvent) and e.data.partial for _, e in events)} partial readings"
    if f.kind == "ups-bad":
        return f"{sum(isinstance(e, CommLost) for _, e in events)} comm_lost"
    if f.kind == "disk-full":
        failed = [e for _, e in events if isinstance(e, CheckpointFailed)]
        return f"{len(failed)} ckpt.failed" + (f" ({failed[0].data.error[:80]})" if failed else "")
    if f.kind == "clock-offset":
        kind = {"coordinator": SagaStateChanged, "ups-monitor": PowerEvent, "power-control": NodeState}[f.target]
        skew = sorted(e.time.timestamp() - t for t, e in events if isinstance(e, kind))
        return f"{f.target}'s events stamped {skew[len(skew) // 2]:+.1f}s off" if skew else "no events"
    return ""


def _kill_a_rank(site) -> None:
    import psutil

    pid = int((site.workdir / "jobs" / f"{site.opts.job}.pid").read_text().split()[0])
    workers = [
        p for p in psutil.Process(pid).children(recursive=True) if "powerguard.sim.train" in " ".join(p.cmdline())
    ]
    if workers:
        workers[-1].send_signal(signal.SIGKILL)


def _check(run, site, events, states, killed, t_fail, t_back, world, Durable, Shutdown) -> None:
    v = run.violations
    sagas = sorted({sid for _, sid, _ in states})
    if len(sagas) != 1:
        v.append(f"one_saga: {len(sagas)} sagas ({', '.join(sagas)})")
    for sid in sagas:
        last = [s for _, i, s in states if i == sid][-1]
        want = ("cancelled", "done") if run.fault.kind == "flap" else ("done",)
        if last not in want:
            v.append(f"saga_terminal: saga {sid} ended {last}")
        acks = [(t, e) for t, e in events if isinstance(e, Durable) and e.data.saga_id == sid]
        power = sorted((t, e) for t, e in acks if (e.data.request_id or "").endswith("/ckpt"))
        ranks: set[int] = set()
        complete_at = None
        for t, e in power:
            ranks.update(e.data.speaks_for())  # rank 0's ack for the job speaks for every rank it names
            if len(ranks) >= world:
                complete_at = t
                break
        partial_at = next((t for t, i, s in states if i == sid and s == "partial"), None)
        settled = min([x for x in (complete_at, partial_at) if x is not None], default=None)
        shut = [t for t, e in events if isinstance(e, Shutdown) and e.data.saga_id == sid and not e.data.dry_run]
        if shut and (settled is None or min(shut) < settled - 0.05):
            v.append("shutdown_after_acks: a shutdown went out before every rank acked or the deadline")
        by_step: dict[int, set[int]] = {}  # every checkpoint of the saga (power, retries, final): who acked it
        for _, e in acks:
            by_step.setdefault(e.data.step, set()).update(e.data.speaks_for())
        complete = [step for step, r in by_step.items() if len(r) >= world]
        if complete:
            run.checkpoint_step = max(complete)
    if not all(site.node_on(n) for n in site.node_names):
        v.append(f"nodes_on: off after power returned: {[n for n in site.node_names if not site.node_on(n)]}")
    for n in site.node_names:
        changes = json.loads(site.bmc_state[n].read_text()).get("changes", 0)
        if run.fault.kind in CUTS:
            # the site's own power loss cycles every node once more (off with it, on by the BMC's
            # restore policy): that is the site's, not PowerGuard's; each command at most once
            log = Path(f"{site.bmc_state[n]}.log").read_text().splitlines()
            sent = Counter(line.split(" ", 1)[1] for line in log if " command " in line)
            twice = {c: k for c, k in sent.items() if k > 1}
            if twice or changes > 4:
                v.append(f"no_double_cycle: {n} got {dict(sent)} ({changes} power changes, the cut's two included)")
        elif changes > 2:
            v.append(f"no_double_cycle: {n} changed power state {changes} times")
    log = (site.workdir / "job.log").read_text(errors="replace") if (site.workdir / "job.log").exists() else ""
    restored = [int(m) for m in re.findall(r"restored step (\d+)", log)]
    run.restored_step = max(restored) if restored else None
    if not site.final.exists():
        v.append("resumed_from_commit: training did not finish")
    elif run.fault.kind != "flap" and run.checkpoint_step is not None:
        if run.restored_step is None or run.restored_step < run.checkpoint_step:
            v.append(
                f"resumed_from_commit: restored {run.restored_step}, the outage's checkpoint was {run.checkpoint_step}"
            )
    unplanned = [n for n in site.dead() if n not in killed]
    if unplanned:
        v.append(f"no_unplanned_exit: {', '.join(unplanned)} died")


async def campaign(
    seeds: list[int],
    *,
    steps: int = 250,
    keep: Path | None = None,
    kinds: tuple[str, ...] = KINDS,
    fault: Fault | None = None,
) -> list[Run]:
    runs = []
    for seed in seeds:
        with tempfile.TemporaryDirectory(prefix=f"pg-chaos-{seed}-") as tmp:
            work = Path(tmp)
            r = await one(seed, work, steps=steps, kinds=kinds, fault=fault)
            if r.violations and keep is not None:  # the site's logs, to read the failure later
                import shutil

                shutil.copytree(work, keep / f"seed-{seed}", dirs_exist_ok=True, ignore_dangling_symlinks=True)
        runs.append(r)
        print(json.dumps(asdict(r)), flush=True)
    return runs


def summary(detail: list[dict]) -> dict:
    """Runs (as dicts) counted by fault and phase, with every violation and its seed."""
    by_kind: dict[str, dict[str, int]] = {}
    for r in detail:
        k = by_kind.setdefault(r["fault"]["kind"], {"runs": 0, "violations": 0})
        k["runs"] += 1
        k["violations"] += bool(r["violations"])
    return {
        "runs": len(detail),
        "runs_with_violations": sum(bool(r["violations"]) for r in detail),
        "by_fault": by_kind,
        "by_phase": {p: sum(r["fault"]["phase"] == p for r in detail) for p in (*PHASES, "start")},
        "violations": [
            {"seed": r["seed"], "fault": r["fault"], "violations": r["violations"]} for r in detail if r["violations"]
        ],
    }


def merge(old: dict, detail: list[dict], sitting: dict) -> dict:
    """This sitting's runs added to an earlier campaign's (a campaign of 100 drills need not be one
    sitting); a run of the same seed drawn from the same kinds is replaced by the new one."""
    sittings = old.get("sittings") or [
        {"seeds": [r["seed"] for r in old.get("runs_detail", [])], "kinds": "first", "wall_s": old.get("wall_s", 0)}
    ]
    new = {r["seed"] for r in detail}
    same = sitting["kinds"]
    kept = [r for r in old.get("runs_detail", []) if r["seed"] not in new or _kinds_of(sittings, r) != same]
    return _result(kept + detail, [*sittings, sitting])


def _kinds_of(sittings: list[dict], run: dict) -> str:
    return next((s["kinds"] for s in reversed(sittings) if run["seed"] in s["seeds"]), "all")


def _result(detail: list[dict], sittings: list[dict]) -> dict:
    return {
        **summary(detail),
        "wall_s": round(sum(s["wall_s"] for s in sittings), 1),
        "sittings": sittings,
        "runs_detail": detail,
    }


BEGIN, END = "<!-- chaos:begin -->", "<!-- chaos:end -->"


def table(result: dict) -> str:
    """The campaign as markdown, for docs/reliability.md."""
    lines = [
        f"{result['runs']} drills, {result['runs_with_violations']} with a violation "
        f"({result['wall_s'] / 60:.0f} min, `bench/results/chaos.json`).",
        "",
        "| fault | runs | in the hold | in the shutdown | in the restore | from the start "
        "| in the power checkpoint | in the final checkpoint or shutdown | at the UPS's output off "
        "| runs with a violation |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    detail = result["runs_detail"]
    for kind in KINDS:
        mine = [r for r in detail if r["fault"]["kind"] == kind]
        if not mine:
            continue
        by = {p: sum(r["fault"]["phase"] == p for r in mine) for p in (*PHASES, "start")}
        bad = sum(bool(r["violations"]) for r in mine)
        cells = " | ".join(
            str(by[p]) for p in ("hold", "shutdown", "restore", "start", "checkpoint", "stop", "ups-off")
        )
        lines.append(f"| {kind} | {len(mine)} | {cells} | {bad} |")
    for v in result["violations"]:
        lines.append("")
        lines.append(
            f"* seed {v['seed']} ({v['fault']['kind']} in the {v['fault']['phase']}): {'; '.join(v['violations'])}"
        )
    return "\n".join(lines)


def render(result: dict, doc: Path) -> None:
    text = doc.read_text()
    a, b = text.index(BEGIN) + len(BEGIN), text.index(END)
    doc.write_text(text[:a] + "\n" + table(result) + "\n" + text[b:])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=100, help="how many drills (default 100)")
    p.add_argument("--seed", type=int, default=1, help="the first seed; run i uses seed + i")
    p.add_argument("--replay", type=int, nargs="*", help="run exactly these seeds")
    p.add_argument(
        "--kinds",
        default="all",
        help="the faults to draw from: all (default), first (the first eight: replays the campaign's first "
        "sitting, seeds 1-54), twelve (all but the power cuts: replays the sittings before them), fourteen "
        "(all but the management host's cut), or a comma-separated list of fault kinds",
    )
    p.add_argument(
        "--fault",
        metavar="KIND,PHASE[,TARGET[,OFFSET_S]]",
        help="run every seed with this fault instead of a drawn one (e.g. clock-offset,start,coordinator,-50)",
    )
    p.add_argument("--steps", type=int, default=250, help="training steps of the job")
    p.add_argument("--keep", type=Path, help="copy the site of every failed run here")
    p.add_argument("--out", type=Path, default=OUT / "chaos.json")
    p.add_argument("--merge", action="store_true", help="add this sitting's runs to those already in --out")
    p.add_argument("--render", type=Path, metavar="DOC", help="only write the table of --out into DOC")
    args = p.parse_args()
    if args.render:
        render(json.loads(args.out.read_text()), args.render)
        return
    named = {"all": KINDS, "first": FIRST_KINDS, "twelve": TWELVE_KINDS, "fourteen": FOURTEEN_KINDS}
    kinds = named.get(args.kinds) or tuple(args.kinds.split(","))
    unknown = set(kinds) - set(KINDS)
    if unknown:
        p.error(f"unknown fault kind(s) {sorted(unknown)}; known: {', '.join(KINDS)}")
    fault = None
    if args.fault:
        kind, phase, *rest = args.fault.split(",")
        if kind not in KINDS or phase not in (*PHASES, "start", "before"):
            p.error(f"--fault {args.fault!r}: kind one of {', '.join(KINDS)}; phase hold, shutdown, restore or start")
        fault = Fault(kind, phase, 2.0, rest[0] if rest else "", float(rest[1]) if len(rest) > 1 else 0.0)
    seeds = args.replay or [args.seed + i for i in range(args.runs)]
    t0 = time.monotonic()
    runs = asyncio.run(campaign(seeds, steps=args.steps, keep=args.keep, kinds=kinds, fault=fault))
    detail = [asdict(r) for r in runs]
    sitting = {
        "seeds": seeds,
        "kinds": args.fault or args.kinds,
        "commit": _commit(),
        "wall_s": round(time.monotonic() - t0, 1),
    }
    if args.merge and args.out.exists():
        result = merge(json.loads(args.out.read_text()), detail, sitting)
    else:
        result = _result(detail, [sitting])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("runs_detail", "sittings")}, indent=2))
    sys.exit(1 if any(r["violations"] for r in detail) else 0)


def _commit() -> str:
    import subprocess

    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


if __name__ == "__main__":
    main()
