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
err = Console(stderr=True, soft_wrap=True)  # paths and keys never broken over lines
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
        raise typer.BadParameter("give --config site.yaml or at least one --site-name")
    return BusNames(), sorted(set(sites))


@creds_app.command("init")
def init(
    directory: Path = DIR,
    config: Path = typer.Option(
        None, "--config", "-c", "--site", help="Site YAML (its site name and NATS names; --site: the same file)"
    ),
    site: list[str] = typer.Option(
        None, "--site-name", metavar="NAME", help="Site name; repeat for several (with or without --config)"
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
    config: Path = CONFIG,
    url: str = URL,
    ca: Path = CA,
    offline: bool = typer.Option(
        False, "--offline", help="Only write resolver.conf (the servers learn it at their next restart or reload)"
    ),
) -> None:
    """Revoke one credential (a job's, a leaked one) and keep every other, while the servers run:
    the account, signed again with the revocation, is pushed to every server of the cluster
    (NATS's account-update path, as the deployment's system user), which closes the credential's
    open connections and refuses new ones at once; then a new connection with it is tried, to
    show it refused. resolver.conf is written too: copy it to the server's auth/resolver.conf so
    a restart keeps the revocation."""
    from powerguard.bus import creds
    from powerguard.bus.env import connection
    from powerguard.schemas import PowerGuardError, load_site

    try:
        done = creds.revoke(directory, creds_file)
    except PowerGuardError as exc:
        err.print(f"[red]error:[/red] {exc}", highlight=False)
        raise typer.Exit(1) from None
    who = f"{done.name or '?'} ({done.user})"
    err.print(f"revoked {who} in the account; wrote {directory / 'resolver.conf'}", highlight=False)
    keep = f"copy {directory / 'resolver.conf'} to the server's auth/resolver.conf: a restart then keeps the revocation"
    if offline:
        err.print(f"not pushed (--offline): {keep}, then reload the server (systemctl reload powerguard-nats)")
        return
    from powerguard.bus import BusError
    from powerguard.bus.revocation import push, try_connect

    try:
        site = load_site(config) if config else None
        server, auth = connection(site.nats if site else None, url=url, creds=creds.system_creds(directory), ca=ca)
        # a server updates only an account it has loaded (else "jwt update skipped", and it would
        # load the old one from its resolver.conf later): one connection of the account loads it
        asyncio.run(try_connect(server, creds_file, auth))
        pushed = asyncio.run(push(server, auth, done.account, done.account_jwt))
    except (BusError, PowerGuardError, OSError) as exc:
        err.print(f"[red]error:[/red] the servers were not told: {exc}", highlight=False)
        err.print(f"the credential still works until they are: run this again, or {keep} and reload the server")
        raise typer.Exit(1) from None
    missing = sorted(set(pushed.servers) - set(pushed.updated))
    err.print(
        f"pushed to {len(pushed.updated)} of {len(pushed.servers)} server(s) ({', '.join(pushed.updated)}): "
        "they closed the credential's open connections",
        highlight=False,
    )
    if missing or pushed.errors:
        err.print(f"[red]error:[/red] not updated: {'; '.join(pushed.errors) or ', '.join(missing)}", highlight=False)
        raise typer.Exit(1)
    refusal = asyncio.run(try_connect(server, creds_file, auth))
    if refusal is None:
        err.print(f"[red]error:[/red] a new connection with {creds_file} was still accepted by {server}")
        raise typer.Exit(1)
    err.print(f"checked: a new connection with it is refused ({refusal.rsplit(': ', 1)[-1]})", highlight=False)
    err.print(f"{keep}; check again any time: powerguard creds check {creds_file}", highlight=False)


@creds_app.command("backup")
def backup(
    out: Path = typer.Argument(..., help="The archive to write, e.g. /var/backups/powerguard/creds.tgz"),
    directory: Path = DIR,
) -> None:
    """Archive the credentials directory (with account-signing.nk: it signs new credentials) as
    a gzipped tar readable by its owner only (0600); the archive it replaces is kept as
    OUT.previous. Keep it offline."""
    from powerguard.bus import creds
    from powerguard.schemas import PowerGuardError

    try:
        kept = creds.backup(directory, out)
    except (PowerGuardError, OSError) as exc:
        err.print(f"[red]error:[/red] {exc}", highlight=False)
        raise typer.Exit(1) from None
    err.print(f"wrote {out} (0600)" + (f"; the one before it is {kept}" if kept else ""), highlight=False)


@creds_app.command("check")
def check(
    creds_file: Path = typer.Argument(..., help="A credential file"),
    config: Path = CONFIG,
    url: str = URL,
    ca: Path = CA,
) -> None:
    """Whether the server accepts a credential now (exit 0) or refuses it (exit 1, with the
    server's words): after a revocation, or to find why a job cannot connect."""
    from powerguard.bus.env import connection
    from powerguard.bus.revocation import try_connect
    from powerguard.schemas import PowerGuardError, load_site

    try:
        site = load_site(config) if config else None
        server, auth = connection(site.nats if site else None, url=url, ca=ca)
        refusal = asyncio.run(try_connect(server, creds_file, auth))
    except PowerGuardError as exc:
        err.print(f"[red]error:[/red] {exc}", highlight=False)
        raise typer.Exit(2) from None
    if refusal:
        err.print(f"refused: {refusal}", highlight=False)
        raise typer.Exit(1)
    err.print(f"accepted: {server} lets {creds_file} connect", highlight=False)


def bootstrap(
    config: Path = CONFIG,
    url: str = URL,
    creds_file: Path = typer.Option(
        None, "--creds", help="The admin credential (env NATS_CREDS; the site file's nats.creds_file)"
    ),
    ca: Path = CA,
    site: list[str] = typer.Option(
        None, "--site-name", metavar="NAME", help="More sites (by name) whose services use this stream"
    ),
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
