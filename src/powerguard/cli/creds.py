"""`powerguard creds ...` and `powerguard bootstrap`: a deployment's NATS identities and its
one-time JetStream setup (docs/security.md)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import typer
from rich.console import Console

from ._conn import CA, CONFIG, URL

creds_app = typer.Typer(
    rich_markup_mode=None,
    help="NATS credentials: an operator, an account, one identity per service and one per training job.",
    no_args_is_help=True,
)
err = Console(stderr=True)
DIR = typer.Option(Path("creds"), "--dir", "-d", help="Credentials directory (keep it on the admin host)")


def _duration(text: str | None) -> float | None:
    if not text:
        return None
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd])", text.strip())
    if not m:
        raise typer.BadParameter("use a number and a unit: 90s, 30m, 12h, 30d")
    return float(m[1]) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m[2]]


def _site_names(config: Path | None, sites: list[str] | None):
    from powerguard.bus import BusNames
    from powerguard.schemas import load_site

    if config is not None:
        cfg = load_site(config)
        return BusNames.from_settings(cfg.nats), sorted({*(sites or []), cfg.site})
    if not sites:
        raise typer.BadParameter("give --config site.yaml or at least one --site")
    return BusNames(), sorted(set(sites))


@creds_app.command("init")
def init(
    directory: Path = DIR,
    config: Path = typer.Option(None, "--config", "-c", help="Site YAML (its site name and NATS names)"),
    site: list[str] = typer.Option(
        None, "--site", metavar="SITE", help="Site name; repeat for several (with or without --config)"
    ),
    force: bool = typer.Option(False, "--force", help="Replace existing credentials (every issued one stops working)"),
) -> None:
    """Make the operator, the accounts, the server's resolver.conf and one .creds per service
    (admin, ups-monitor, coordinator, power-control, observer, operator)."""
    from powerguard.bus import creds
    from powerguard.schemas import PowerGuardError

    names, sites = _site_names(config, site)
    try:
        paths = creds.init(directory, names=names, sites=sites, force=force)
    except PowerGuardError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from None
    for p in paths:
        err.print(f"wrote {p}")
    err.print(
        f"copy {directory / 'resolver.conf'} to auth/resolver.conf beside the shipped nats.conf (which includes "
        f"it), start nats-server, then: powerguard bootstrap --config site.yaml --creds {directory / 'admin.creds'}"
    )


@creds_app.command("issue")
def issue(
    directory: Path = DIR,
    job: str = typer.Option(None, "--job", "-j", help="A training job: its ranks may speak for this job only"),
    node: str = typer.Option(
        None,
        "--node",
        "-n",
        help="With --job: its ranks on this node only (the server then confirms every rank's node; give the "
        "file to that node's leaf nats-server, not to the ranks)",
    ),
    role: str = typer.Option(
        None, "--role", help="Another role: observer, operator, ups-monitor, ... (not with --job)"
    ),
    out: Path = typer.Option(None, "--out", "-o", help="Write here (default: <dir>/agent-<job>[-<node>].creds)"),
    expires_in: str = typer.Option(None, "--expires-in", help="Valid for this long: 90s, 30m, 12h, 30d"),
) -> None:
    """Sign a credential with the account's signing key (the server needs no change). Give the
    job's ranks its file as NATS_CREDS (or CheckpointAgent(nats_creds=...))."""
    from powerguard.bus import creds
    from powerguard.schemas import PowerGuardError

    if bool(job) == bool(role):
        raise typer.BadParameter("give exactly one of --job and --role")
    if node and not job:
        raise typer.BadParameter("--node is for an agent credential: give --job too")
    try:
        path = creds.issue(
            directory, "agent" if job else role, job=job, node=node, out=out, expires_in_s=_duration(expires_in)
        )
    except (PowerGuardError, ValueError) as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from None
    err.print(f"wrote {path}")


@creds_app.command("revoke")
def revoke(
    creds_file: Path = typer.Argument(..., help="The credential to revoke (its user key: every copy of it)"),
    directory: Path = DIR,
) -> None:
    """Revoke one credential (a job's, a leaked one) and keep every other: the account, re-signed
    with the revocation, is written to resolver.conf; copy it to the server's auth/resolver.conf
    and reload the server (systemctl reload powerguard-nats, or SIGHUP)."""
    from powerguard.bus import creds
    from powerguard.schemas import PowerGuardError

    try:
        name, user = creds.revoke(directory, creds_file)
    except PowerGuardError as exc:
        err.print(f"[red]error:[/red] {exc}", highlight=False)
        raise typer.Exit(1) from None
    err.print(
        f"revoked {name or '?'} ({user}); wrote {directory / 'resolver.conf'}: copy it to the server's "
        "auth/resolver.conf and reload the server",
        highlight=False,
    )


def bootstrap(
    config: Path = CONFIG,
    url: str = URL,
    creds_file: Path = typer.Option(
        None, "--creds", help="The admin credential (env NATS_CREDS; the site file's nats.creds_file)"
    ),
    ca: Path = CA,
    site: list[str] = typer.Option(None, "--site", metavar="SITE", help="More sites whose services use this stream"),
    replicas: int = typer.Option(None, "--replicas", min=1, help="Stream and bucket replicas (3 on a cluster)"),
    update: bool = typer.Option(
        False,
        "--update",
        help="Also change an existing stream, buckets and consumers to this release's configuration (upgrades)",
    ),
) -> None:
    """Create the stream, the KV buckets and every site's durable consumers (once, as admin).
    Services never create or change them: they only use their own."""
    import os

    from powerguard.bus import BusError
    from powerguard.schemas import PowerGuardError

    from ._conn import target

    try:
        names, sites = _site_names(config, site)
        t = target(config, url, creds_file, ca)
    except PowerGuardError as exc:
        err.print(f"[red]error:[/red] {exc}", highlight=False)
        raise typer.Exit(1) from None
    n = replicas or int(os.environ.get("POWERGUARD_NATS_REPLICAS", "1"))

    from powerguard.bus.bootstrap import bootstrap as run

    try:
        made = asyncio.run(run(url=t.url, names=names, sites=sites, auth=t.auth, replicas=n, update=update))
    except (BusError, PowerGuardError) as exc:
        err.print(f"[red]error:[/red] {exc}", highlight=False)
        raise typer.Exit(1) from None
    err.print(
        f"streams {names.stream}, {names.jobs_stream} and the KV buckets ready; durable consumers: {', '.join(made)}"
    )
