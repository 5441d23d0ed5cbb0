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


def auth_options(nats: NatsSettings | None = None) -> dict[str, Any]:
    """Credentials and TLS for :meth:`Bus.connect`, from the site file's ``nats:`` section, else
    the environment: ``NATS_CREDS``, ``NATS_NKEY_SEED_FILE``, ``NATS_USER`` +
    ``NATS_PASSWORD[_FILE]``, ``NATS_CA``, ``NATS_CERT``, ``NATS_KEY``. One process, one identity."""
    env = os.environ.get

    def pick(field: str, var: str) -> str | None:
        value = getattr(nats, field, None) if nats is not None else None
        return str(value) if value else env(var)

    password = secret_value(nats.password) if nats is not None else None
    return {
        "user": pick("user", "NATS_USER"),
        "password": password or env_secret("NATS_PASSWORD"),
        "creds_file": pick("creds_file", "NATS_CREDS"),
        "nkey_seed_file": pick("nkey_seed_file", "NATS_NKEY_SEED_FILE"),
        "tls_ca": pick("tls_ca", "NATS_CA"),
        "tls_cert": pick("tls_cert", "NATS_CERT"),
        "tls_key": pick("tls_key", "NATS_KEY"),
    }


def secured(options: dict[str, Any]) -> bool:
    """A credential is configured: this client is one party among others, never an admin."""
    return bool(options.get("creds_file") or options.get("nkey_seed_file") or options.get("user"))
