"""`powerguard backup` / `powerguard restore`: the deployment's JetStream state (the events, every
KV bucket, the durable consumers), live, with the admin credential (docs/deploy-bare-metal.md,
"Back up and restore")."""

from __future__ import annotations

import asyncio
from pathlib import Path

import typer
from rich.console import Console

from ._conn import CA, CONFIG, URL, target

err = Console(stderr=True)
ADMIN_CREDS = typer.Option(None, "--creds", help="The admin credential (env NATS_CREDS; the site file's)")


def _run(config, url, creds, ca, command: str, work):
    from powerguard.bus import Bus
    from powerguard.schemas import PowerGuardError

    async def go():
        t = target(config, url, creds, ca)
        t.require("admin", command=f"powerguard {command}")
        bus = await Bus.connect(t.url, service=command, names=t.names, setup=False, **t.auth)
        try:
            return await work(bus)
        finally:
            await bus.close()

    try:
        return asyncio.run(go())
    except PowerGuardError as exc:
        err.print(f"error: {exc}", highlight=False)
        raise typer.Exit(1) from None


def backup(
    out: Path = typer.Argument(
        ..., help="Directory to write (made if missing), e.g. /var/backups/powerguard/$(date +%F)"
    ),
    config: Path = CONFIG,
    url: str = URL,
    creds: Path = ADMIN_CREDS,
    ca: Path = CA,
) -> None:
    """Snapshot the events stream and every KV bucket with their durable consumers, while the site
    runs; each file fsynced, a manifest with SHA-256 last. Back up the credentials directory
    (account-signing.nk) separately and offline."""
    from powerguard.bus.backup import backup as run

    saved = _run(config, url, creds, ca, "backup", lambda bus: run(bus, out))
    for s in saved:
        err.print(f"{s.stream}: {s.messages} messages, {s.bytes} bytes", highlight=False)
    err.print(f"backup complete in {out} (manifest.json)", highlight=False)


def restore(
    source: Path = typer.Argument(..., help="A directory written by `powerguard backup`"),
    config: Path = CONFIG,
    url: str = URL,
    creds: Path = ADMIN_CREDS,
    ca: Path = CA,
) -> None:
    """Restore a backup onto a fresh broker (before the services start): the manifest checked
    first, a stream that already exists refused. The deployment's credentials must be the backed-up
    ones (resolver.conf in the server's auth/)."""
    from powerguard.bus.backup import restore as run

    streams = _run(config, url, creds, ca, "restore", lambda bus: run(bus, source))
    err.print(f"restored {', '.join(streams)} from {source}", highlight=False)
