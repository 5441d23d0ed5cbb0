"""What can be known about a connection before and after trying it: the credential and TLS
files read and parsed (a missing or garbage file is named, never a ``TypeError`` from nkeys),
and the last error of a failed connect turned into one line that names the cause and the fix."""

from __future__ import annotations

import ssl
from pathlib import Path

import nkeys

from powerguard.schemas import ConfigError

from .errors import ConnectError
from .jwt import decode_claims, read_creds_jwt

FIX_CREDS = "give the service's own file with --creds or NATS_CREDS (made by `powerguard creds init|issue`)"


def require_credential(creds_file: str | Path | None, *parties: str, command: str) -> str | None:
    """Refuse, in words, a credential that is not one of ``parties`` (:class:`ConfigError`);
    the server would answer the first request it may not make with a timeout. Returns the
    credential's party; None when there is no file (a server without auth: nothing to check)."""
    if creds_file is None:
        return None
    name = credential_name(creds_file)
    if name in parties:
        return name
    who = f"a training job's ({name})" if name.startswith("agent.") else f"the {name or 'unnamed'} credential"
    raise ConfigError(
        f"`{command}` needs the {' or '.join(parties)} credential; {creds_file} is {who}: "
        f"give --creds creds/{parties[0]}.creds (or NATS_CREDS)"
    )


def credential_name(creds_file: str | Path) -> str:
    """The name inside a ``.creds`` file's user JWT (``ups-monitor``, ``agent.<job>``, ...);
    :class:`ConnectError` naming the file and what is wrong with it otherwise."""
    path = Path(creds_file)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConnectError(f"NATS credential file {path} does not exist: {FIX_CREDS}") from None
    except OSError as exc:
        raise ConnectError(f"cannot read NATS credential file {path}: {exc.strerror}") from None
    try:
        claims = decode_claims(read_creds_jwt(text))
        seed = _seed(text)
        nkeys.from_seed(seed.encode())
    except Exception as exc:  # nkeys raises TypeError, ValueError or its own errors for a garbage seed
        raise ConnectError(
            f"{path} is not a NATS credential (a user JWT and an nkey seed): {exc or type(exc).__name__}; {FIX_CREDS}"
        ) from None
    name = claims.get("name")
    return name if isinstance(name, str) else ""


def _seed(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines()]
    try:
        seed = lines[lines.index("-----BEGIN USER NKEY SEED-----") + 1]
    except (ValueError, IndexError):
        raise ValueError("no nkey seed block") from None
    if not seed.startswith("SU"):
        raise ValueError("the seed block holds no user seed")
    return seed


def check_files(**paths: str | Path | None) -> None:
    """Every named file (``tls_ca=...``, ``nkey_seed_file=...``) is readable."""
    for what, value in paths.items():
        if value is None:
            continue
        path = Path(value)
        if not path.is_file():
            raise ConnectError(f"{what.replace('_', ' ')} {path} does not exist or is not a file")
        try:
            path.open("rb").close()
        except OSError as exc:
            raise ConnectError(f"cannot read {what.replace('_', ' ')} {path}: {exc.strerror}") from None


def cause(exc: BaseException | None) -> str:
    """The last connect error as a cause and a fix, in words."""
    if exc is None:
        return "no server answered"
    text = str(exc) or type(exc).__name__
    low = text.lower()
    if "authorization" in low or "authentication" in low or "user authentication expired" in low:
        return (
            f"the server refused the credential ({text.strip()}): it is not one this server's accounts trust, "
            f"or it expired; {FIX_CREDS}"
        )
    if isinstance(exc, ssl.SSLError) or "certificate" in low or "ssl" in low:
        return f"TLS failed ({text}): check the CA (--ca, NATS_CA or the site file's nats.tls_ca) and the URL's host"
    if isinstance(exc, ConnectionRefusedError) or "connect call failed" in low or "refused" in low:
        return "connection refused: is nats-server running and listening there?"
    return text
