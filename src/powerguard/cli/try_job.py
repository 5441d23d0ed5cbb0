"""``powerguard try -- <command>``: drill your own training job through a simulated outage.

The steps are :mod:`powerguard.sim.tryout`'s: an uninterrupted reference run of the command,
then the same command as the job of the simulated site (the real services; a simulated UPS,
PDU and BMCs) through one outage - checkpoint on the coordinator's request, hold, final
checkpoint, the job stopped and the nodes powered off as on a site, power back, nodes on, the
job restarted and resumed - then the two runs' last states compared tensor by tensor.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

out = Console()

# the command's --help: paragraphs unwrapped (the terminal wraps them)
HELP = "\n\n".join(
    " ".join(p.split())
    for p in """
Drill your own training job through a simulated power outage, on this machine.

Runs your command straight through once (the reference), then again as the job of a simulated site -
embedded NATS, the real coordinator, power-control and ups-monitor, a simulated UPS, PDU and one BMC
per node - through one outage: the coordinator asks for a checkpoint, the hold, a final checkpoint,
your job stopped and the nodes powered off, power back, the nodes on, your job restarted from its
checkpoint. Then every tensor of the two runs' last states is compared. Exit 0: the job resumed,
lost no step and ended identical to the uninterrupted run; 1: it did not (the report says what
differs and the usual causes); 2: the drill could not run.

The script needs a CheckpointAgent (restore(), step(step) after each optimizer step, close() at the
end) and a fixed seed; nothing in it changes: the drill gives the agent the site's bus, the job's
name and nodes, and its own checkpoint directory through the environment. Plain PyTorch loops (DDP,
FSDP2, tensor parallel), PyTorch Lightning and the Hugging Face Trainer with PowerGuard's callback.

Example: powerguard try --json report.json -- torchrun --nproc-per-node 4 train.py --seed 0. Docs:
docs/frameworks/README.md.
""".strip().split("\n\n")
)


def _said(log: Path) -> list[str]:
    """The agent's one-line start messages in a job log ("resumed at step ..." / "fresh start ...")."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return []
    return [ln.strip() for ln in text.splitlines() if "resumed at step" in ln or "fresh start at step" in ln]


async def run_try(
    console: Console,
    command: list[str],
    *,
    work: Path,
    job: str,
    nodes: int | None,
    hold_policy: str,
    hold_s: float,
    min_step_s: float,
    warmup_steps: int | None,
    env: dict[str, str],
    timeout_s: float,
) -> dict:
    """Reference, drill, verdict; the report (a DrillError when the drill could not run)."""
    from powerguard.bus import Bus, BusNames
    from powerguard.ckpt_agent._compare import compare
    from powerguard.sim import tryout as T
    from powerguard.sim.drill import run_drill
    from powerguard.sim.errors import DrillError
    from powerguard.sim.site import SimSite, SiteOptions

    ref_dir, ref_progress, ref_log = work / "reference", work / "reference-progress.txt", work / "reference.log"
    console.print(f"reference: {escape(' '.join(command))} (straight through, no outage; log {ref_log})")
    code, seconds = T.run(
        command,
        env={**env, **T.job_environment(directory=ref_dir, job=job, progress=ref_progress, min_step_s=min_step_s)},
        log=ref_log,
        timeout_s=timeout_s,
    )
    if code != 0:
        tail = ref_log.read_text(errors="replace")[-2000:]
        raise DrillError(f"the reference run exited {code} (log {ref_log}):\n{tail}")
    ref = T.reference_of(T.progress_lines(ref_progress), seconds=seconds, log=ref_log)
    nodes = nodes or (2 if ref.world % 2 == 0 else 1)
    if ref.world % nodes:
        raise DrillError(f"the job's {ref.world} ranks do not split evenly over {nodes} nodes: choose --nodes")
    warmup = warmup_steps if warmup_steps is not None else max(3, ref.steps // 10)
    too_short = T.drill_fits(ref, warmup_steps=warmup, hold_s=hold_s, min_step_s=min_step_s)
    if too_short:
        raise DrillError(too_short)
    console.print(
        f"reference done: {ref.world} ranks, {ref.steps} steps of {ref.step_s * 1000:.0f} ms, {seconds:.1f} s; "
        f"the outage comes after step {ref.first_step + warmup}"
    )
    site_dir = work / "site"
    opts = SiteOptions(
        nodes=nodes,
        ranks_per_node=ref.world // nodes,
        job=job,
        hold_policy=hold_policy,
        max_on_battery_s=hold_s,
        job_command=list(command),
    )
    site = SimSite(site_dir, opts)
    opts.job_env = {
        **env,
        **T.job_environment(
            directory=work / "drill",
            job=job,
            progress=site.progress,
            min_step_s=min_step_s,
            nats_url="{nats_url}",  # the site's broker (SiteOptions.job_env)
            nodes=site.node_names,
        ),
    }

    def notify(at: float, phase: str, text: str) -> None:
        console.print(f"{at:7.2f}s  {phase:<10}  {escape(text)}", highlight=False)

    bus = None
    try:
        await site.start()
        bus = await Bus.connect(site.nats_url, service="try", names=BusNames())
        console.print(f"drill: simulated site in {site_dir} ({nodes} nodes, hold policy {hold_policy})")
        report = await run_drill(site, "outage", notify=notify, bus=bus, warmup_steps=warmup)
    finally:
        if bus is not None:
            await bus.close()
        await site.stop()
    ref_step, ref_ckpt = T.newest_committed(ref_dir, job=job)
    drill_step, drill_ckpt = T.newest_committed(work / "drill", job=job, nodes=site.node_names)
    report |= {
        "command": command,
        "job": job,
        "world": ref.world,
        "reference": {"steps": ref.steps, "step_s": round(ref.step_s, 4), "seconds": round(seconds, 1)},
        "said": _said(site_dir / "job.log"),
        "final_step": {"reference": ref_step, "drill": drill_step},
        "checkpoints": {"reference": str(ref_ckpt), "drill": str(drill_ckpt)},
    }
    if ref_step != drill_step:
        report["bit_exact"] = False
        report["differs"] = [["(last step)", f"reference ended at step {ref_step}, the drilled run at {drill_step}"]]
        return report
    result = compare(str(ref_ckpt), str(drill_ckpt))
    report |= {
        "bit_exact": result.equal,
        "entries_same": len(result.same),
        "differs": [list(d) for d in result.state_differs]
        + [[k, "only in the reference"] for k in result.only_in_first]
        + [[k, "only in the drilled run"] for k in result.only_in_second],
        "rng_differs": result.rng_differs,
        "causes": [] if result.equal else result.causes(),
    }
    return report


def _print(console: Console, r: dict) -> None:
    w = r.get("work") or {}
    lost = w.get("lost_steps")
    console.print(f"saga: {' -> '.join(r.get('saga_states') or [])}", highlight=False)
    console.print(
        f"checkpoint at step {r.get('checkpoint_step')} ({r.get('all_acked_s')} s after the power failed), "
        f"final checkpoint at step {r.get('final_checkpoint_step')}, nodes off after {r.get('nodes_off_s')} s, "
        f"restored at step {r.get('restored_step')}; {lost} steps trained twice",
        highlight=False,
    )
    for line in r.get("said", []):
        console.print(f"  the job said: {escape(line)}", highlight=False)
    for k, how in r.get("differs", []):
        console.print(f"  [red]{escape(k)}[/red]: {escape(how)}", highlight=False)
    for cause in r.get("causes", []):
        console.print(f"  - {escape(cause)}", highlight=False)
    if r.get("rng_differs"):
        console.print(f"note: RNG states differ ({escape(', '.join(r['rng_differs']))}): an unseeded generator")
    failures = r.get("checkpoint_failures") or []
    for f in failures:
        console.print(f"  [red]rank {f['rank']}'s {f['request']} checkpoint failed[/red]: {escape(str(f['error']))}")
    if failures:
        console.print(
            "[red]DRILL NOT OK[/red]: a checkpoint request was not answered in time (the run "
            + ("resumed bit-exact" if r.get("bit_exact") else "resumed, its last state DIFFERING")
            + f", {lost} steps lost): on a real outage with less battery there would be no checkpoint "
            '(docs/frameworks/pytorch.md, "Evaluation and other quiet phases")'
        )
    elif r.get("bit_exact") and lost == 0:
        console.print(
            f"[green]DRILL OK[/green]: the job survived the outage, resumed at step {r.get('restored_step')}, lost no "
            f"step, and its last state is identical to the uninterrupted run's ({r.get('entries_same')} entries)"
        )
    elif r.get("bit_exact"):
        console.print(f"[yellow]DRILL: {lost} steps lost[/yellow]; the resumed run's last state is identical")
    else:
        console.print("[red]DRILL: the resumed run's last state DIFFERS from the uninterrupted run's[/red]")


def try_job(
    command: list[str] = typer.Argument(
        ..., help="Your training command, after --: e.g. -- torchrun --nproc-per-node 2 train.py --lr 3e-4"
    ),
    nodes: int = typer.Option(
        None,
        "--nodes",
        min=1,
        help="Simulated nodes, the ranks split over them in order (default 2; 1 for an odd world)",
    ),
    hold_policy: str = typer.Option(
        "checkpoint-at-stop", "--hold-policy", help="checkpoint-at-stop (the default), pause or continue"
    ),
    hold_s: float = typer.Option(3.0, "--hold-s", min=0, help="Seconds on battery before the site shuts down"),
    min_step_s: float = typer.Option(
        0.05,
        "--min-step-s",
        min=0,
        help="Stretch shorter steps to this (both runs): the outage must fall inside training",
    ),
    warmup_steps: int = typer.Option(None, "--warmup-steps", min=1, help="Steps before the outage (default: a tenth)"),
    job: str = typer.Option("try", "--job", help="The job's name on the simulated site (replaces the script's)"),
    env_names: list[str] = typer.Option(
        [],
        "--env",
        metavar="NAME",
        help="Pass this variable of your environment to the job (repeatable); the job otherwise gets "
        "the allowlist power-control's process adapter passes (PATH, HOME, PYTHONPATH, VIRTUAL_ENV, LC_*, ...)",
    ),
    workdir: Path = typer.Option(None, "--workdir", help="Keep the runs' checkpoints, logs and the site here"),
    json_out: Path = typer.Option(None, "--json", help="Write the report here"),
    timeout_s: float = typer.Option(1800.0, "--timeout", min=1, help="Seconds the reference run may take"),
) -> None:
    """Drill your own training job through a simulated power outage (see :data:`HELP`)."""
    from ._extras import require_agent

    require_agent("try")
    from powerguard.power_control.schedulers.base import safe_env
    from powerguard.schemas import HOLD_POLICIES
    from powerguard.sim.errors import DrillError

    if hold_policy not in HOLD_POLICIES:
        out.print(f"[red]error:[/red] --hold-policy must be one of {', '.join(HOLD_POLICIES)}")
        raise typer.Exit(2)
    missing = [n for n in env_names if n not in os.environ]
    if missing:
        out.print(f"[red]error:[/red] --env {', '.join(missing)}: not set in this environment")
        raise typer.Exit(2)
    own = workdir is None
    work = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="pg-try-"))
    for sub in ("reference", "drill", "drill-merged", "site"):
        shutil.rmtree(work / sub, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    env = {**safe_env(), **{n: os.environ[n] for n in env_names}}
    try:
        report = asyncio.run(
            run_try(
                out,
                command,
                work=work.resolve(),
                job=job,
                nodes=nodes,
                hold_policy=hold_policy,
                hold_s=hold_s,
                min_step_s=min_step_s,
                warmup_steps=warmup_steps,
                env=env,
                timeout_s=timeout_s,
            )
        )
    except DrillError as exc:
        out.print(f"[red]DRILL NOT RUN:[/red] {escape(str(exc))} (work dir {work})")
        raise typer.Exit(2) from None
    if json_out:
        json_out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    _print(out, report)
    ok = report.get("bit_exact") and (report.get("work") or {}).get("lost_steps") == 0
    ok = ok and not report.get("checkpoint_failures")
    if own and ok:
        shutil.rmtree(work, ignore_errors=True)
    elif not ok:
        out.print(f"logs and checkpoints kept in {work}")
    raise typer.Exit(0 if ok else 1)
