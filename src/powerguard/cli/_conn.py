"""The connection options every bus command shares (--config, --url, --creds, --ca), with one
precedence (:data:`powerguard.bus.env.PRECEDENCE`), and the checks that turn a wrong
credential into a sentence before the server answers with a timeout."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import typer

from powerguard.bus import BusNames
from powerguard.bus.env import PRECEDENCE, connection
from powerguard.schemas import SiteConfig, load_site

CONFIG = typer.Option(
    None,
    "--config",
    "-c",
    "--site",
    help="Site YAML: its nats: section (URL, names, credential, CA) and the site's name (--site: the same file; "
    "a site's name alone is --site-name)",
)
URL = typer.Option(None, "--url", "-s", help="NATS server URL(s), comma-separated (env NATS_URL; the site file's)")
CREDS = typer.Option(None, "--creds", help="NATS credential file (env NATS_CREDS; the site file's nats.creds_file)")
CA = typer.Option(
    None, "--ca", help="CA that signed the server's certificate (env NATS_CA; the site file's nats.tls_ca)"
)
EPILOG = PRECEDENCE


@dataclass(frozen=True)
class Target:
    """Where a command connects, as who, with which names."""

    url: str
    auth: dict
    names: BusNames
    site: SiteConfig | None

    def require(self, *roles: str, command: str) -> None:
        """Refuse, in words, a credential that is not one of ``roles`` (the server would answer the
        first request it may not make with a timeout)."""
        from powerguard.bus.connect_checks import require_credential

        require_credential(self.auth.get("creds_file"), *roles, command=command)


def target(config: Path | None, url: str | None, creds: Path | None, ca: Path | None) -> Target:
    site = load_site(config) if config else None
    nats = site.nats if site else None
    server, auth = connection(nats, url=url, creds=creds, ca=ca)
    return Target(server, auth, BusNames.from_settings(nats) if nats else BusNames(), site)
