"""`powerguard config check`: the whole deployment as the services will see it, one line per
problem (docs/deploy-bare-metal.md, "Check before you start")."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

config_app = typer.Typer(
    rich_markup_mode=None, help="Check a site's configuration before the services start.", no_args_is_help=True
)
err = Console(stderr=True)


def _given(items: list[str]) -> dict[str, Path]:
    from powerguard.ops.site_check import PARTIES

    out = {}
    for item in items:
        party, sep, path = item.partition("=")
        if not sep or party not in PARTIES or not path:
            raise typer.BadParameter(f"{item!r}: use PARTY=FILE with PARTY one of {', '.join(PARTIES)}")
        out[party] = Path(path)
    return out


@config_app.command("check")
def check(
    site: Path = typer.Option(..., "--site", "--config", "-c", help="The site YAML every service reads"),
    offline: bool = typer.Option(False, "--offline", help="The files only: no NATS, no UPS, BMC or PDU is contacted"),
    creds_dir: Path = typer.Option(
        None,
        "--creds-dir",
        help="The credentials directory (`powerguard creds init`): <party>.creds for ups-monitor, coordinator, "
        "power-control (required), observer, operator, admin (when present)",
    ),
    creds_for: list[str] = typer.Option(
        [],
        "--creds-for",
        help="PARTY=FILE: the credential one party uses, when not <creds-dir>/<party>.creds (repeatable)",
    ),
    url: str = typer.Option(None, "--url", "-s", help="NATS URL (env NATS_URL; the site file's nats.url)"),
    ca: Path = typer.Option(
        None, "--ca", help="CA of the server's certificate (env NATS_CA; the site file's nats.tls_ca)"
    ),
    timeout_s: float = typer.Option(5.0, "--timeout", min=0.5, help="Seconds for each connection and device"),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per finding, one per line"),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Also print what is fine"),
) -> None:
    """Check the site file against every service's schema (an unknown section refused), resolve
    every secret reference, check each party's credential file (present, mode 600, the right party's,
    made for this site) and, unless --offline, connect to NATS with each service's credential, read
    each UPS once and reach each node's BMC and PDU outlets. Run it as the services' user, on the
    host they run on. Exit 0: no problem; 1: a line per problem, each naming what and where."""
    from powerguard.ops import live_check, site_check
    from powerguard.ops.findings import failed

    given = _given(creds_for)

    async def run():
        cfg, found = await site_check.offline(site, creds_dir=creds_dir, given=given)
        if cfg is None or offline:
            return found
        parties = {
            p: (given.get(p) or creds_dir / f"{p}.creds")
            for p in site_check.PARTIES
            if p in given or (creds_dir is not None and (creds_dir / f"{p}.creds").exists())
        }
        parties = {p: path for p, path in parties.items() if p not in failed(found, "credential")}
        skip_ups = failed(found, "ups")
        skip_nodes = failed(found, "node")
        broken = {f.where.removeprefix("section ") for f in found if not f.ok and f.where.startswith("section ")}
        found += await live_check.guarded("nats", live_check.nats(cfg, parties, url=url, ca=ca, timeout_s=timeout_s))
        # a service whose own section is wrong is not run: its problem is said once, above
        if "ups_monitor" not in broken:
            found += await live_check.guarded("ups", live_check.ups(cfg, skip_ups))
        if "power_control" not in broken:
            found += await live_check.guarded("devices", live_check.devices(cfg, skip_nodes))
        return found

    found = asyncio.run(run())
    problems = [f for f in found if not f.ok]
    if as_json:
        for f in found:
            sys.stdout.write(json.dumps(f.as_dict()) + "\n")
    else:
        out = Console(highlight=False, soft_wrap=True)
        for f in found:
            if not f.ok:
                out.print(f"[red]PROBLEM[/red] {escape(f.where)}: {escape(f.text)}")
            elif verbose:
                out.print(f"[green]ok[/green]      {escape(f.where)}: {escape(f.text)}")
        checked = "the files" if offline else "the files, NATS and the devices"
        summary = (
            f"{len(problems)} problem(s) in {len(found)} checks of {checked}"
            if problems
            else f"no problem in {len(found)} checks of {checked}"
        )
        err.print(summary)
    if problems:
        raise typer.Exit(1)
