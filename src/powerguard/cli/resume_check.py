"""``powerguard check-resume``: prove a training script resumes exactly.

The same command runs three times, unchanged (the agent reads its mode from the environment,
``ckpt_agent._check``): straight through, its last step checkpointed at exit; then stopped
right after a checkpoint at ``--stop-at``; then started again, resuming there, its last step
checkpointed at exit. The two last checkpoints are compared entry by entry (model, optimizer,
scheduler, registered state, every rank's RNG): identical, or the entries that differ and
the usual causes. No bus, no coordinator: the checkpoints go to the check's own directory.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

out = Console()


@dataclass
class Run:
    name: str
    log: Path
    code: int


def _run(name: str, command: list[str], work: Path, env: dict[str, str], timeout_s: float) -> Run:
    from powerguard.sim.tryout import run

    log = work / f"{name}.log"
    code, _ = run(command, env={**os.environ, **env}, log=log, timeout_s=timeout_s)
    return Run(name, log, code)


def _newest(root: Path) -> tuple[str, int, Path]:
    """(job, step, directory) of the newest committed checkpoint under a check directory."""
    from powerguard.ckpt_agent import _layout as L

    jobs = [p for p in root.iterdir() if p.is_dir()] if root.is_dir() else []
    if len(jobs) != 1:
        raise ValueError(f"{root}: expected the checkpoints of one job, found {[p.name for p in jobs] or 'none'}")
    fs, _ = L.fs_for(str(root))
    steps = [(s, d) for s, d in L.list_steps(fs, str(root), jobs[0].name) if os.path.exists(f"{d}/{L.COMMIT}")]
    if not steps:
        raise ValueError(f"{jobs[0]}: no committed checkpoint (does the script call guard.close()?)")
    return jobs[0].name, steps[0][0], Path(steps[0][1])


def _drawn_from(compare, stopped: Path, final: Path, differing: list[str]) -> list[str]:
    """The RNG states among ``differing`` that the resumed run drew from (changed between the
    stop's checkpoint and the end): a generator the script never uses differs between two runs
    of an unseeded process, and says nothing about the script."""
    if not differing or stopped == final or not (stopped / "COMMIT").exists():
        return differing
    changed = set(compare(str(stopped), str(final)).rng_differs)
    return [k for k in differing if k in changed]


def _never_trained(compare, stopped: Path, final: Path) -> bool:
    """The model's entries are identical at the stop's checkpoint and at the end."""
    if stopped == final or not (stopped / "COMMIT").exists():
        return False
    changed = compare(str(stopped), str(final)).state_differs
    return not any(key.startswith("model.") for key, _ in changed)


def check_resume(
    command: list[str] = typer.Argument(
        ..., help="The training command, after --: e.g. -- torchrun --nproc-per-node 2 train.py --lr 3e-4"
    ),
    stop_at: int = typer.Option(..., "--stop-at", min=0, help="Checkpoint this step, stop, resume from it"),
    workdir: Path = typer.Option(None, "--workdir", help="Keep the runs' checkpoints and logs here"),
    timeout_s: float = typer.Option(3600.0, "--timeout", min=1, help="Seconds each of the three runs may take"),
) -> None:
    """Prove your script resumes exactly: run it straight through, and checkpointed at --stop-at,
    stopped and resumed; compare every tensor of the two final states (model, optimizer, scheduler,
    registered state, RNGs). Exit 0 when identical; else name the tensors that differ and why they
    usually do. The script needs a CheckpointAgent (restore(), step() after each optimizer step,
    close() at the end) and a fixed seed; nothing else changes."""
    from ._extras import require_agent

    require_agent("check-resume")
    work = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="pg-check-resume-"))
    for sub in ("straight", "resumed"):
        shutil.rmtree(work / sub, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    straight, resumed = work / "straight", work / "resumed"
    runs = [
        ("straight", {"POWERGUARD_CHECK_DIR": str(straight), "POWERGUARD_CHECK_FINAL": "1"}),
        ("stopped", {"POWERGUARD_CHECK_DIR": str(resumed), "POWERGUARD_CHECK_STOP_AT": str(stop_at)}),
        ("resumed", {"POWERGUARD_CHECK_DIR": str(resumed), "POWERGUARD_CHECK_FINAL": "1"}),
    ]
    for name, env in runs:
        out.print(f"{name}: running {escape(' '.join(command))}", highlight=False)
        run = _run(name, command, work, env, timeout_s)
        if run.code != 0:
            tail = run.log.read_text(errors="replace")[-2000:]
            out.print(f"[red]NOT CHECKED:[/red] the {name} run exited {run.code} (log {run.log}):\n{escape(tail)}")
            raise typer.Exit(2)
    try:
        job, a_step, a_dir = _newest(straight)
        _, b_step, b_dir = _newest(resumed)
    except ValueError as exc:
        out.print(f"[red]NOT CHECKED:[/red] {escape(str(exc))}")
        raise typer.Exit(2) from None
    said = (work / "resumed.log").read_text(errors="replace")
    if f"checkpoint of step {stop_at}" not in said:
        out.print(
            f"[red]NOT CHECKED:[/red] the third run did not resume from the checkpoint of step {stop_at} "
            f"(log {work / 'resumed.log'})"
        )
        raise typer.Exit(2)
    if a_step != b_step:
        out.print(f"[red]NOT CHECKED:[/red] the runs ended at different steps ({a_step} straight, {b_step} resumed)")
        raise typer.Exit(2)
    from powerguard.ckpt_agent._compare import compare

    result = compare(str(a_dir), str(b_dir))
    where = f"job {job}, step {a_step}: straight {a_dir} vs resumed at {stop_at} {b_dir}"
    drawn = _drawn_from(compare, b_dir.parent / f"step-{stop_at}", b_dir, result.rng_differs)
    if drawn:
        out.print(
            f"note: RNG states differ ({escape(', '.join(drawn))}): an unseeded generator the script draws from (two "
            "runs start from different states): it would not reproduce: seed it",
            highlight=False,
        )
    if result.equal and _never_trained(compare, b_dir.parent / f"step-{stop_at}", b_dir):
        out.print(
            f"[red]NOT CHECKED:[/red] the model's parameters are the same at step {stop_at} and at step {b_step}: "
            "the run never changed them (a loss of 0, a learning rate of 0, frozen parameters?), so identical "
            "end states prove nothing about the resume"
        )
        raise typer.Exit(2)
    if result.equal:
        out.print(f"[green]RESUMES EXACTLY[/green]: {len(result.same)} entries identical ({escape(where)})")
        return
    out.print(f"[red]DIFFERS[/red] after the resume ({escape(where)}):", highlight=False)
    for key, how in result.state_differs:
        out.print(f"  {escape(key)}: {escape(how)}", highlight=False)
    for key in result.only_in_first:
        out.print(f"  {escape(key)}: only in the straight run", highlight=False)
    for key in result.only_in_second:
        out.print(f"  {escape(key)}: only in the resumed run", highlight=False)
    out.print(f"{len(result.same)} entries identical. Usual causes:", highlight=False)
    for cause in result.causes():
        out.print(f"  - {escape(cause)}", highlight=False)
    out.print("See docs/frameworks/pytorch.md, 'Bit-exact resume'.", highlight=False)
    raise typer.Exit(1)
