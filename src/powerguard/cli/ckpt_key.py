"""`powerguard ckpt-key ...`: the checkpoint keys. The site key (any file of at least 16 random
bytes) stays with the operator; each job's container gets its own key, derived from it, which
signs and checks that job's checkpoints only (docs/security.md, "Checkpoints")."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

ckpt_key_app = typer.Typer(
    rich_markup_mode=None,
    help="Checkpoint keys: the site's, and one per training job (what its container holds).",
    no_args_is_help=True,
)
err = Console(stderr=True, soft_wrap=True)


@ckpt_key_app.command("issue")
def issue(
    job: str = typer.Option(..., "--job", "-j", help="The training job (its CheckpointAgent(job=...))"),
    site_key: Path = typer.Option(
        ..., "--site-key", help="The site's checkpoint key file (keep it off the nodes that run jobs)"
    ),
    out: Path = typer.Option(..., "--out", "-o", help="The job's key file to write (0600)"),
) -> None:
    """Write the key of one job, derived from the site key: give the job's ranks this file as
    POWERGUARD_CKPT_KEY_FILE. With it they sign and check their own job's checkpoints only: a
    container cannot sign a checkpoint another job would restore. The site key checks every
    job's (python -m powerguard.ckpt_agent verify --key-file SITE_KEY DIR)."""
    from powerguard.ckpt_agent import _keys as K
    from powerguard.ckpt_agent.errors import CheckpointError
    from powerguard.schemas.file_modes import write_private
    from powerguard.schemas.subjects import token

    try:
        token(job, what="job")
        site = K.load_key(site_key)
    except (CheckpointError, ValueError) as exc:
        err.print(f"[red]error:[/red] {exc}", highlight=False)
        raise typer.Exit(1) from None
    write_private(out, K.job_key_file_text(site, job).encode())
    err.print(f"wrote {out} (0600): job {job}'s checkpoint key; give it to the job as POWERGUARD_CKPT_KEY_FILE")
