"""NATS decentralized-auth JWTs (v2): operator, account and user claims signed with nkeys.

NATS's own security model, not an invention: an operator signs accounts, an account (through a
signing key) signs users, and every user JWT carries the subjects the *server* lets it publish
and subscribe. The server needs no change to accept a new user: ``powerguard creds issue``
signs one per job. Keys and signatures come from ``nkeys`` (nats-io's Ed25519 library); the
claims are the small JSON documents of the JWT v2 format (github.com/nats-io/jwt), written
here because the only Python JWT package for NATS pulls in four more dependencies.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any

import nkeys

HEADER = {"typ": "JWT", "alg": "ed25519-nkey"}
UNLIMITED = -1


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def new_key(kind: str) -> nkeys.KeyPair:
    """A new Ed25519 key pair of a kind: ``operator``, ``account`` or ``user``."""
    prefix = {
        "operator": nkeys.PREFIX_BYTE_OPERATOR,
        "account": nkeys.PREFIX_BYTE_ACCOUNT,
        "user": nkeys.PREFIX_BYTE_USER,
    }
    seed = nkeys.encode_seed(os.urandom(32), prefix[kind])
    return nkeys.from_seed(bytearray(seed))


def key_from_seed(seed: str | bytes) -> nkeys.KeyPair:
    return nkeys.from_seed(bytearray(seed.encode() if isinstance(seed, str) else seed))


def public(kp: nkeys.KeyPair) -> str:
    return kp.public_key.decode()


def seed_of(kp: nkeys.KeyPair) -> str:
    return kp.seed.decode()


def encode(
    claims_nats: dict[str, Any], *, subject: str, name: str, issuer: nkeys.KeyPair, expires: int | None = None
) -> str:
    """Sign a JWT: ``claims_nats`` is the ``nats`` section (type, version and the rest)."""
    claims: dict[str, Any] = {
        "iat": int(time.time()),
        "iss": public(issuer),
        "name": name,
        "sub": subject,
        "nats": {**claims_nats, "version": 2},
    }
    if expires:
        claims["exp"] = int(expires)
    body = json.dumps(claims, separators=(",", ":"), sort_keys=True).encode()
    claims["jti"] = base64.b32encode(hashlib.new("sha512_256", body).digest()).rstrip(b"=").decode()
    head = _b64(json.dumps(HEADER, separators=(",", ":")).encode())
    payload = _b64(json.dumps(claims, separators=(",", ":"), sort_keys=True).encode())
    signature = _b64(bytes(issuer.sign(f"{head}.{payload}".encode())))
    return f"{head}.{payload}.{signature}"


def decode_claims(token: str) -> dict[str, Any]:
    """The claims of a JWT (not verified: the server verifies; this reads one's own)."""
    payload = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))


@dataclass(frozen=True)
class Permissions:
    """What the server lets one user publish and subscribe (allow minus deny)."""

    pub_allow: tuple[str, ...] = ()
    pub_deny: tuple[str, ...] = ()
    sub_allow: tuple[str, ...] = ()
    sub_deny: tuple[str, ...] = ()
    inbox: str = "_INBOX"

    def claims(self) -> dict[str, Any]:
        def part(allow: tuple[str, ...], deny: tuple[str, ...]) -> dict[str, list[str]]:
            out: dict[str, list[str]] = {}
            if allow:
                out["allow"] = list(dict.fromkeys(allow))
            if deny:
                out["deny"] = list(dict.fromkeys(deny))
            return out

        return {"pub": part(self.pub_allow, self.pub_deny), "sub": part(self.sub_allow, self.sub_deny)}


def operator_jwt(op: nkeys.KeyPair, *, name: str, system_account: str) -> str:
    return encode({"type": "operator", "system_account": system_account}, subject=public(op), name=name, issuer=op)


def account_jwt(
    op: nkeys.KeyPair,
    account: str,
    *,
    name: str,
    signing_keys: list[str],
    jetstream: bool,
    revocations: dict[str, int] | None = None,
) -> str:
    """An account; ``revocations``: user public key -> time (the server refuses that user's JWTs
    issued at or before it)."""
    limits: dict[str, Any] = {
        "subs": UNLIMITED,
        "data": UNLIMITED,
        "payload": UNLIMITED,
        "imports": UNLIMITED,
        "exports": UNLIMITED,
        "wildcards": True,
        "conn": UNLIMITED,
        "leaf": UNLIMITED,
    }
    if jetstream:
        limits.update(mem_storage=UNLIMITED, disk_storage=UNLIMITED, streams=UNLIMITED, consumer=UNLIMITED)
    claims: dict[str, Any] = {"type": "account", "limits": limits, "signing_keys": signing_keys}
    if revocations:
        claims["revocations"] = dict(revocations)
    if not jetstream:
        claims["exports"] = [
            {
                "name": "account-monitoring-services",
                "subject": "$SYS.REQ.ACCOUNT.*.*",
                "type": "service",
                "response_type": "Stream",
                "account_token_position": 4,
            }
        ]
    return encode(claims, subject=account, name=name, issuer=op)


@dataclass
class UserSpec:
    name: str
    permissions: Permissions
    expires: int | None = None
    tags: list[str] = field(default_factory=list)
    payload: int = UNLIMITED  # the largest message the server accepts from this user (bytes)


def user_jwt(signer: nkeys.KeyPair, user: str, *, account: str, spec: UserSpec) -> str:
    """A user of ``account`` signed by one of its signing keys (``issuer_account`` names it)."""
    claims = {
        "type": "user",
        **spec.permissions.claims(),
        "subs": UNLIMITED,
        "data": UNLIMITED,
        "payload": spec.payload,
        "issuer_account": account,
    }
    if spec.tags:
        claims["tags"] = spec.tags
    return encode(claims, subject=user, name=spec.name, issuer=signer, expires=spec.expires)


def creds(jwt: str, seed: str) -> str:
    """The ``.creds`` file nats clients read (``nats.connect(user_credentials=...)``)."""
    return (
        "-----BEGIN NATS USER JWT-----\n"
        f"{jwt}\n"
        "------END NATS USER JWT------\n\n"
        "************************* IMPORTANT *************************\n"
        "NKEY Seed printed below can be used to sign and prove identity.\n"
        "NKEYs are sensitive and should be treated as secrets.\n\n"
        "-----BEGIN USER NKEY SEED-----\n"
        f"{seed}\n"
        "------END USER NKEY SEED------\n\n"
        "*************************************************************\n"
    )


def read_creds_jwt(text: str) -> str:
    """The user JWT inside a ``.creds`` file."""
    lines = [ln.strip() for ln in text.splitlines()]
    try:
        return lines[lines.index("-----BEGIN NATS USER JWT-----") + 1]
    except (ValueError, IndexError):
        raise ValueError("not a NATS .creds file (no user JWT block)") from None
