"""Settings every process reads from its environment the same way."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from powerguard.schemas.site import secret_value

if TYPE_CHECKING:
    from powerguard.schemas.site import NatsSettings


def env_secret(name: str) -> str | None:
    """``NAME_FILE`` (a mounted secret, read and stripped) or ``NAME``; None when neither is set."""
    path = os.environ.get(f"{name}_FILE")
    return Path(path).read_text().strip() if path else os.environ.get(name)


DEFAULT_URL = "nats://127.0.0.1:4222"

PRECEDENCE = (
    "Where the connection comes from, in every command and service: a flag (--url, --creds, --ca), "
    "else the environment (NATS_URL, NATS_CREDS, NATS_CA; NATS_CERT/NATS_KEY for mutual TLS), else the site "
    "file's nats: section (url, creds_file, tls_ca, ...), else nats://127.0.0.1:4222 without a credential."
)


def auth_options(nats: NatsSettings | None = None) -> dict[str, Any]:
    """Credentials and TLS for :meth:`Bus.connect`, from the environment (``NATS_CREDS``,
    ``NATS_NKEY_SEED_FILE``, ``NATS_USER`` + ``NATS_PASSWORD[_FILE]``, ``NATS_CA``,
    ``NATS_CERT``, ``NATS_KEY``), else the site file's ``nats:`` section: one site file for
    every service, one identity per process, which its environment names (:data:`PRECEDENCE`)."""
    env = os.environ.get

    def pick(field: str, var: str) -> str | None:
        if env(var):
            return env(var)
        value = getattr(nats, field, None) if nats is not None else None
        return str(value) if value else None

    password = secret_value(nats.password) if nats is not None else None
    return {
        "user": pick("user", "NATS_USER"),
        "password": env_secret("NATS_PASSWORD") or password,
        "creds_file": pick("creds_file", "NATS_CREDS"),
        "nkey_seed_file": pick("nkey_seed_file", "NATS_NKEY_SEED_FILE"),
        "tls_ca": pick("tls_ca", "NATS_CA"),
        "tls_cert": pick("tls_cert", "NATS_CERT"),
        "tls_key": pick("tls_key", "NATS_KEY"),
    }


def secured(options: dict[str, Any]) -> bool:
    """A credential is configured: this client is one party among others, never an admin."""
    return bool(options.get("creds_file") or options.get("nkey_seed_file") or options.get("user"))


def connection(
    nats: NatsSettings | None = None,
    *,
    url: str | None = None,
    creds: str | Path | None = None,
    ca: str | Path | None = None,
) -> tuple[str, dict[str, Any]]:
    """The server URL and :meth:`Bus.connect`'s auth options with :data:`PRECEDENCE`: the flags
    given here, then the environment, then the site file's ``nats:`` section."""
    server = url or os.environ.get("NATS_URL") or (nats.url if nats is not None else None) or DEFAULT_URL
    auth = auth_options(nats)
    if creds:
        auth.update(creds_file=str(creds), user=None, password=None, nkey_seed_file=None)
    if ca:
        auth["tls_ca"] = str(ca)
    return server, auth
