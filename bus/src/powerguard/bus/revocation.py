"""Revocation while the servers run: the account JWT with its revocations pushed on NATS's own
account-update path (``$SYS.REQ.ACCOUNT.<account>.CLAIMS.UPDATE``, as ``nsc push`` does), which
every server of a cluster subscribes to with a memory resolver; each answers "jwt updated", then
closes the revoked user's open connections and refuses new ones. No reload, no restart: a reload
of a changed operator JWT is refused by nats-server, and a restart drops every connection.

:func:`push` sends it with ``system.creds`` (creds.system_creds) and returns which servers took
it; :func:`try_connect` is the check that follows: a new connection with the revoked credential.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .client import Bus
from .errors import BusError, ConnectError


@dataclass(frozen=True)
class Pushed:
    servers: list[str]  # every server that answered the ping
    updated: list[str]  # those that said "jwt updated"
    errors: list[str]  # "server: what it said" for the others


async def _gather(nc: Any, subject: str, payload: bytes, *, want: int | None, timeout: float, quiet: float) -> list:
    """Publish with a reply inbox; the replies until ``want`` came, ``timeout`` passed, or none
    for ``quiet`` seconds after the first (the number of servers is not known beforehand)."""
    inbox = nc.new_inbox()
    got: list = []
    arrived = asyncio.Event()

    async def on(msg) -> None:
        with contextlib.suppress(ValueError):
            got.append(json.loads(msg.data))
        arrived.set()

    sub = await nc.subscribe(inbox, cb=on)
    try:
        await nc.publish(subject, payload, reply=inbox)
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while loop.time() < end and (want is None or len(got) < want):
            arrived.clear()
            wait = end - loop.time() if not got else min(quiet, end - loop.time())
            try:
                await asyncio.wait_for(arrived.wait(), max(wait, 0.0))
            except TimeoutError:
                if got:
                    break
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
    return got


def _server(reply: dict) -> str:
    s = reply.get("server") or {}
    return str(s.get("name") or s.get("id") or "?")


async def push(url: str, auth: dict[str, Any], account: str, account_jwt: str, *, timeout: float = 10.0) -> Pushed:
    """Send ``account_jwt`` to every server reachable from ``url``, as the system user of
    ``auth['creds_file']``. Raises :class:`BusError` when no server answered."""
    bus = await Bus.connect(url, service="powerguard-creds-revoke", setup=False, connect_timeout=timeout, **auth)
    try:
        pongs = await _gather(bus.nc, "$SYS.REQ.SERVER.PING", b"", want=None, timeout=timeout, quiet=0.5)
        servers = sorted({_server(p) for p in pongs})
        replies = await _gather(
            bus.nc,
            f"$SYS.REQ.ACCOUNT.{account}.CLAIMS.UPDATE",
            account_jwt.encode(),
            want=max(len(servers), 1),
            timeout=timeout,
            quiet=max(1.0, timeout / 4),
        )
    finally:
        await bus.close()
    if not replies:
        raise BusError(
            f"no server at {url} answered the account update in {timeout:g}s (is system.creds of this deployment, "
            "and does the server's configuration name the system account?)"
        )
    updated, errors = [], []
    for r in replies:
        data = r.get("data") or {}
        if data.get("code") == 200 and data.get("message") == "jwt updated":
            updated.append(_server(r))
        else:
            errors.append(f"{_server(r)}: {data.get('message') or data.get('description') or r.get('error') or r}")
    return Pushed(servers or sorted(updated), sorted(updated), errors)


async def try_connect(url: str, creds_file: str | Path, auth: dict[str, Any], *, timeout: float = 5.0) -> str | None:
    """Connect once with ``creds_file``: None when the server accepted it, else its refusal."""
    options = {k: v for k, v in auth.items() if k.startswith("tls_")}
    try:
        bus = await Bus.connect(
            url,
            service="powerguard-creds-check",
            creds_file=creds_file,
            setup=False,
            connect_timeout=timeout,
            once=True,
            **options,
        )
    except ConnectError as exc:
        return str(exc)
    await bus.close()
    return None
