"""A deployment's NATS identities: ``powerguard creds init`` makes the operator, the accounts,
the server's resolver configuration and one credential per service; ``powerguard creds issue``
signs more (one per training job) with the account's signing key, without touching the server.

Layout of the credentials directory (keep it on the admin host; mode 0700)::

    operator.nk  system.nk  account.nk   the identity seeds (only needed to re-sign accounts)
    account-signing.nk                   signs users: whoever holds it can issue credentials
    operator.jwt  system.jwt             signed once at init: the server reloads a resolver.conf
                                         only while its operator JWT stays the same
    resolver.conf                        include it in nats.conf (operator, accounts, resolver)
    <role>.creds                         admin, ups-monitor, coordinator, power-control, observer, operator
    system.creds                         a system-account user that may only push the account's
                                         JWT to the running servers (`creds revoke`)
    deployment.json                      names and sites the credentials were made for

Revocation (``creds revoke``) signs the account again with the user's key in its revocations and
pushes it to every server of the cluster on ``$SYS.REQ.ACCOUNT.<account>.CLAIMS.UPDATE`` (NATS's
own account-update path; :mod:`powerguard.bus.revocation`): the servers close the user's open
connections and refuse new ones at once. resolver.conf carries the same account for restarts.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from powerguard.schemas import ConfigError

from . import jwt
from .names import BusNames
from .roles import ROLES, max_payload, permissions

SERVICE_ROLES = ("admin", "ups-monitor", "coordinator", "power-control", "observer", "operator")


def _write(path: Path, text: str, mode: int = 0o600) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, mode)


def _names_from(meta: dict) -> BusNames:
    return BusNames(**meta["names"])


def init(directory: Path, *, names: BusNames, sites: list[str], force: bool = False) -> list[Path]:
    """Make the operator, the system and PowerGuard accounts and every service's credential."""
    directory = Path(directory)
    if (directory / "account-signing.nk").exists() and not force:
        raise ConfigError(f"{directory} already holds credentials (use --force to replace them all)")
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    for old in ("operator.jwt", "system.jwt", "resolver.conf", "system.creds"):  # --force: signed anew
        (directory / old).unlink(missing_ok=True)
    op, sys_acc, acc, signing = (
        jwt.new_key("operator"),
        jwt.new_key("account"),
        jwt.new_key("account"),
        jwt.new_key("account"),
    )
    for name, kp in (("operator", op), ("system", sys_acc), ("account", acc), ("account-signing", signing)):
        _write(directory / f"{name}.nk", jwt.seed_of(kp) + "\n")
    meta = {
        "names": {k: v for k, v in asdict(names).items() if k != "subjects"},
        "sites": sites,
        "account": jwt.public(acc),
        "created": int(time.time()),
        "revocations": {},
    }
    _write_resolver(directory, meta)
    _write(directory / "deployment.json", json.dumps(meta, indent=2) + "\n", 0o644)
    return [
        directory / "resolver.conf",
        *(issue(directory, role) for role in SERVICE_ROLES),
        system_creds(directory),
    ]


def _key(directory: Path, name: str):
    return jwt.key_from_seed((directory / f"{name}.nk").read_text().strip())


def _signed_once(directory: Path, name: str, sign) -> str:
    """The operator's (``operator``) or the system account's (``system``) JWT as first signed:
    nats-server refuses to reload a configuration whose operator JWT changed ("config reload not
    supported for TrustedOperators"), so they are signed once and kept. A deployment made before
    they were kept takes them from its resolver.conf."""
    path = directory / f"{name}.jwt"
    if path.exists():
        return path.read_text().strip()
    token = None
    old = directory / "resolver.conf"
    if old.exists():
        text = old.read_text()
        if name == "operator":
            m = re.search(r'^operator: "([^"]+)"', text, re.M)
        else:
            m = re.search(rf'^\s*{jwt.public(_key(directory, "system"))}: "([^"]+)"', text, re.M)
        token = m[1] if m else None
    token = token or sign()
    _write(path, token)
    return token


def account_jwt(directory: Path, meta: dict) -> str:
    """The PowerGuard account signed with its signing key and ``meta``'s revocations."""
    op, acc, signing = (_key(directory, n) for n in ("operator", "account", "account-signing"))
    return jwt.account_jwt(
        op,
        jwt.public(acc),
        name="POWERGUARD",
        signing_keys=[jwt.public(signing)],
        jetstream=True,
        revocations=meta.get("revocations") or None,
    )


def _write_resolver(directory: Path, meta: dict) -> str:
    """The server's resolver.conf: the operator and both accounts (as first signed), the
    PowerGuard account with its signing key and its revocations. Returns the account's JWT."""
    op, sys_acc = _key(directory, "operator"), _key(directory, "system")
    op_jwt = _signed_once(
        directory, "operator", lambda: jwt.operator_jwt(op, name="powerguard", system_account=jwt.public(sys_acc))
    )
    sys_jwt = _signed_once(
        directory,
        "system",
        lambda: jwt.account_jwt(op, jwt.public(sys_acc), name="SYS", signing_keys=[], jetstream=False),
    )
    acc_jwt = account_jwt(directory, meta)
    resolver = (
        "# generated by `powerguard creds init` / `creds revoke`: the shipped nats.conf includes it as\n"
        "# auth/resolver.conf. `creds revoke` also pushes the account to the running servers; this file\n"
        "# keeps the revocation across a restart (or a reload: systemctl reload powerguard-nats)\n"
        f'operator: "{op_jwt}"\n'
        f"system_account: {jwt.public(sys_acc)}\n"
        "resolver: MEMORY\n"
        "resolver_preload: {\n"
        f'  {jwt.public(sys_acc)}: "{sys_jwt}"\n'
        f'  {meta["account"]}: "{acc_jwt}"\n'
        "}\n"
    )
    _write(directory / "resolver.conf", resolver, 0o644)
    return acc_jwt


def system_creds(directory: Path) -> Path:
    """``system.creds``: a user of the system account that may publish only the PowerGuard
    account's claims update (and ping the servers, to know how many must answer), made on first
    use for a deployment made before it existed."""
    directory = Path(directory)
    path = directory / "system.creds"
    if path.exists():
        return path
    meta = json.loads((directory / "deployment.json").read_text())
    sys_acc, user = _key(directory, "system"), jwt.new_key("user")
    perms = jwt.Permissions(
        pub_allow=(f"$SYS.REQ.ACCOUNT.{meta['account']}.CLAIMS.UPDATE", "$SYS.REQ.SERVER.PING"),
        sub_allow=("_INBOX.system.>",),
    )
    token = jwt.user_jwt(sys_acc, jwt.public(user), account=jwt.public(sys_acc), spec=jwt.UserSpec("system", perms))
    _write(path, jwt.creds(token, jwt.seed_of(user)))
    return path


@dataclass(frozen=True)
class Revoked:
    name: str  # the credential's name (agent.<job>[.<node>], a role)
    user: str  # its user key: every JWT of it issued until now is refused
    account: str  # the account's public key
    account_jwt: str  # the account, signed again with the revocation: what the servers must load


def revoke(directory: Path, creds_file: Path) -> Revoked:
    """Revoke the user of ``creds_file`` (every JWT of its key issued until now) in the account:
    rewrites resolver.conf; the others' credentials stay valid. The running servers learn it
    only when :func:`powerguard.bus.revocation.push` sends them the returned account JWT."""
    directory = Path(directory)
    try:
        meta = json.loads((directory / "deployment.json").read_text())
        claims = jwt.decode_claims(jwt.read_creds_jwt(Path(creds_file).read_text()))
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(f"cannot revoke {creds_file} with {directory}: {exc}") from None
    if claims.get("nats", {}).get("issuer_account") != meta["account"]:
        raise ConfigError(f"{creds_file} was not issued by the account in {directory}")
    user = claims["sub"]
    # revoked: every JWT of the user issued at or before this second (its iat); a later second,
    # never an earlier one than the newest it has (a credential issued in this second included)
    meta.setdefault("revocations", {})[user] = max(int(time.time()), int(claims.get("iat", 0)))
    acc_jwt = _write_resolver(directory, meta)
    _write(directory / "deployment.json", json.dumps(meta, indent=2) + "\n", 0o644)
    return Revoked(claims.get("name", ""), user, meta["account"], acc_jwt)


def issue(
    directory: Path,
    role: str,
    *,
    job: str | None = None,
    node: str | None = None,
    out: Path | None = None,
    expires_in_s: float | None = None,
) -> Path:
    """Sign a credential for ``role`` (an ``agent`` for one ``job``, and with ``node`` for its
    ranks on that node only) with the account signing key."""
    directory = Path(directory)
    if role not in ROLES:
        raise ConfigError(f"role must be one of {', '.join(ROLES)}")
    try:
        meta = json.loads((directory / "deployment.json").read_text())
        signing = jwt.key_from_seed((directory / "account-signing.nk").read_text().strip())
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(
            f"{directory}: no deployment credentials ({exc}); run `powerguard creds init` first"
        ) from None
    perms = permissions(role, _names_from(meta), sites=meta["sites"], job=job, node=node)
    user = jwt.new_key("user")
    name = ".".join(["agent", job, *([node] if node else [])]) if role == "agent" and job else role
    expires = int(time.time() + expires_in_s) if expires_in_s else None
    spec = jwt.UserSpec(name, perms, expires, payload=max_payload(role))
    token = jwt.user_jwt(signing, jwt.public(user), account=meta["account"], spec=spec)
    agent_file = f"agent-{job}" + (f"-{node}" if node else "") + ".creds"
    path = Path(out) if out else directory / (agent_file if role == "agent" else f"{role}.creds")
    _write(path, jwt.creds(token, jwt.seed_of(user)))
    return path


def backup(directory: Path, out: Path) -> Path | None:
    """The credentials directory as a gzipped tar at ``out``: 0600 from its first byte, written
    beside the last one and renamed over it when complete, which is kept as ``<out>.previous``
    (never the only good copy overwritten). Returns where the replaced one went (None: none)."""
    import io
    import tarfile

    from powerguard.schemas.file_modes import write_private

    from .backup import rotate_into

    directory, out = Path(directory), Path(out)
    if not (directory / "deployment.json").exists():
        raise ConfigError(f"{directory}: not a credentials directory (no deployment.json)")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(directory, arcname=directory.name)
    partial = out.with_name(out.name + ".partial")
    write_private(partial, buf.getvalue())
    return rotate_into(partial, out)


def expiry_of(creds_file: str | Path | None) -> float | None:
    """When the credential in ``creds_file`` expires (Unix time), or None (never, or unreadable)."""
    if not creds_file:
        return None
    try:
        exp = jwt.decode_claims(jwt.read_creds_jwt(Path(creds_file).read_text())).get("exp")
    except (OSError, ValueError):
        return None
    return float(exp) if isinstance(exp, int | float) else None


def inbox_of(creds_file: str | Path) -> str | None:
    """The reply-subject prefix a credential may subscribe to (``_INBOX.<its name>``)."""
    try:
        claims = jwt.decode_claims(jwt.read_creds_jwt(Path(creds_file).read_text()))
    except (OSError, ValueError):
        return None
    name = claims.get("name")
    return f"_INBOX.{name}" if isinstance(name, str) and name else None
