"""`powerguard power ...`: operator commands through power-control's own drivers."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

power_app = typer.Typer(
    rich_markup_mode=None,
    help="Operate node power through the site's BMCs and PDUs (the drivers power-control uses).",
    no_args_is_help=True,
)
err = Console(stderr=True)
SITE = typer.Option(
    ...,
    "--config",
    "--site",
    "-c",
    help="Site YAML (nodes, BMCs, PDUs, credentials by reference); env POWERGUARD_CONFIG",
    envvar="POWERGUARD_CONFIG",
)
NODES = typer.Option(None, "--node", "-n", metavar="NODE", help="Node name; repeat for several (default: every node)")
JSON = typer.Option(False, "--json", help="JSON instead of a table")
DRY_RUN = typer.Option(
    False, "--dry-run", help="Resolve the nodes and their devices and say what would be done; touch no BMC or PDU"
)


def _run(coro_fn, site: Path, *args, **kw) -> list:
    from powerguard.power_control.errors import PowerControlError
    from powerguard.schemas import PowerGuardError, load_site

    try:
        return asyncio.run(coro_fn(load_site(site), *args, **kw))
    except (PowerGuardError, PowerControlError) as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None


def _show(rows: list, title: str, as_json: bool) -> None:
    if as_json:
        sys.stdout.write(json.dumps([r.as_dict() for r in rows], indent=2) + "\n")
    else:
        table = Table(title=title)
        for col in ("node", "driver", "power", "restore policy", "outlets"):
            table.add_column(col)
        table.add_column("verdict / error", overflow="fold")  # a path in an error is shown whole
        for r in rows:
            table.add_row(
                r.node,
                r.driver,
                r.power or "-",
                r.restore_policy or "-",
                r.outlets or "-",
                f"[red]{r.error}[/red]" if r.error else r.verdict,
            )
        Console().print(table)
    if any(r.error for r in rows):
        raise typer.Exit(1)


@power_app.command("status")
def status_cmd(site: Path = SITE, node: list[str] = NODES, as_json: bool = JSON) -> None:
    """Read every node's power state from its BMC and its PDU outlets."""
    from powerguard.power_control import operator

    _show(_run(operator.status, site, node), "node power", as_json)


def _action(action: str, site: Path, node: list[str], dry_run: bool, as_json: bool) -> None:
    from powerguard.power_control import operator

    if not node:
        err.print("[red]error:[/red] name the node(s) with --node (power actions never default to every node)")
        raise typer.Exit(2)
    _show(_run(operator.act, site, node, action, dry_run=dry_run), f"power {action}", as_json)


@power_app.command("on")
def on_cmd(site: Path = SITE, node: list[str] = NODES, dry_run: bool = DRY_RUN, as_json: bool = JSON) -> None:
    """Power node(s) on through their BMC."""
    _action("on", site, node, dry_run, as_json)


@power_app.command("off")
def off_cmd(
    site: Path = SITE,
    node: list[str] = NODES,
    soft: bool = typer.Option(False, "--soft", help="ACPI shutdown request instead of a hard power off"),
    dry_run: bool = DRY_RUN,
    as_json: bool = JSON,
) -> None:
    """Power node(s) off through their BMC (hard, or --soft for an ACPI shutdown)."""
    _action("soft_off" if soft else "off", site, node, dry_run, as_json)


@power_app.command("audit")
def audit_cmd(
    site: Path = SITE,
    node: list[str] = NODES,
    fix: bool = typer.Option(False, "--fix", help="Set the policy power_control.restore_policy asks for"),
    as_json: bool = JSON,
) -> None:
    """Report nodes whose BMC would not power them on by itself after an outage (power-restore policy)."""
    from powerguard.power_control import operator

    rows = _run(operator.audit, site, node, fix=fix)
    _show(rows, "power-restore policy audit", as_json)
    if any(r.verdict.startswith("would not") for r in rows):
        raise typer.Exit(3)


@power_app.command("job-start")
def job_start_cmd(
    job: str = typer.Argument(..., help="The job's name: a job of the site file's process scheduler"),
    site: Path = SITE,
    node: list[str] = typer.Option(
        None, "--node", "-n", metavar="NODE", help="Its nodes (POWERGUARD_NODES); repeat (default: every node)"
    ),
) -> None:
    """A `process` job's first start, exactly as power-control restarts it after an outage: its
    argv, cwd, env (the allowlist, its own env, POWERGUARD_*) and log, its own session, its
    process group written to <state_dir>/<job>.pid so that the first outage can stop it. Run it
    as the service's user (sudo -u powerguard). A job whose pid file names a running group is
    not started again."""
    from powerguard.power_control.errors import PowerControlError
    from powerguard.power_control.schedulers import make_scheduler
    from powerguard.power_control.service import load_settings
    from powerguard.schemas import PowerGuardError, load_site

    try:
        cfg = load_site(site)
        settings = load_settings(cfg)
        if settings.scheduler.kind != "process":
            err.print(
                f"[red]error:[/red] the site's job scheduler is {settings.scheduler.kind!r}: job-start starts jobs of "
                "the process scheduler only (the others have their own: sbatch, docker run, kubectl)"
            )
            raise typer.Exit(2)
        nodes = node or [n.name for n in cfg.nodes]
        said = asyncio.run(make_scheduler(settings.scheduler).start_job(job, nodes=nodes, saga_id="first-start"))
    except (PowerGuardError, PowerControlError) as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    err.print(said)
