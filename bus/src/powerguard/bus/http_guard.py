"""Who may call a PowerGuard HTTP endpoint on a host (the console, the ckpt-agent's trigger):
the checks a loopback server needs against a web page in a browser on the same host.

* ``Host`` (and ``Origin``, when a browser sends one) must name a host the server serves:
  loopback, plus the names it was given. A page on another site that points its own name at
  127.0.0.1 (DNS rebinding) or posts across sites is refused, token or not.
* An optional token: ``Authorization: Bearer <token>``, or HTTP basic auth with the token as
  password (what browsers and EventSource handle), compared in constant time; any malformed
  header is simply a wrong credential.
"""

from __future__ import annotations

import base64
import hmac

from aiohttp import web
from yarl import URL

LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})


def same(given: str, token: str) -> bool:
    """Constant-time comparison of any credential a client sends (bytes: a non-ASCII string is
    a wrong credential, never an error)."""
    return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), token.encode("utf-8"))


def authorized(request: web.Request, token: str | None) -> bool:
    if token is None:
        return True
    header = request.headers.get("Authorization", "")
    if header.startswith("Bearer "):
        return same(header[7:].strip(), token)
    if header.startswith("Basic "):
        try:
            _, _, password = base64.b64decode(header[6:], validate=True).decode().partition(":")
        except ValueError:
            return False
        return same(password, token)
    return False


def host_refusal(request: web.Request, allowed: frozenset[str], *, what: str = "this server") -> str | None:
    """Why the request's Host or Origin is refused (None: both name a host in ``allowed``)."""
    try:
        host = (URL(f"//{request.headers.get('Host', '')}").host or "").lower().strip("[]")
    except ValueError:
        host = ""
    if host not in allowed:
        return f"Host {request.headers.get('Host', '')!r} is not a name {what} serves"
    origin = request.headers.get("Origin")
    if origin is not None and origin != "null":
        try:
            o = (URL(origin).host or "").lower().strip("[]")
        except ValueError:
            o = ""
        if o not in allowed:
            return f"Origin {origin!r} is not a site {what} serves"
    return None
