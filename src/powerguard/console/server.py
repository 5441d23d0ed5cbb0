"""The console's web server (aiohttp): the page, its script, the state as JSON, the state pushed
as server-sent events, and each saga's timeline picture. Read-only: nothing here publishes on the
bus. Binds to 127.0.0.1 unless told otherwise; optional TLS and a token (``Authorization: Bearer``
or HTTP basic auth with the token as password, which browsers and EventSource handle).

Every request's ``Host`` (and ``Origin``, when a browser sends one) must name a host this console
serves: loopback by default, plus the names given (``--allow-host``). A web page on another
site that points its own name at 127.0.0.1 (DNS rebinding) is refused, token or not."""

from __future__ import annotations

import asyncio
import json
import ssl
from importlib import resources
from typing import Any

from aiohttp import web

from powerguard.bus.http_guard import LOOPBACK, authorized, host_refusal

from .feed import Feed
from .state import ConsoleState, timeline_svg

PUSH_EVERY_S = 0.25  # at most this often a snapshot per browser
KEEPALIVE_S = 10.0


def _static(name: str) -> str:
    return resources.files("powerguard.console").joinpath("static", name).read_text(encoding="utf-8")


def make_app(
    state: ConsoleState,
    feed: Feed | None = None,
    *,
    token: str | None = None,
    allowed_hosts: frozenset[str] | set[str] | tuple[str, ...] = (),
) -> web.Application:
    allowed = LOOPBACK | {h.lower().strip("[]") for h in allowed_hosts}

    @web.middleware
    async def auth(request: web.Request, handler):
        if request.path != "/healthz" and (why := host_refusal(request, allowed, what="this console")) is not None:
            raise web.HTTPMisdirectedRequest(text=f"{why} (--allow-host)\n")
        if request.path != "/healthz" and not authorized(request, token):
            raise web.HTTPUnauthorized(headers={"WWW-Authenticate": 'Basic realm="powerguard console"'})
        response = await handler(request)
        response.headers.setdefault("Cache-Control", "no-store")
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Content-Security-Policy"] = "default-src 'self'; img-src 'self' data:; style-src 'self'"
        return response

    app = web.Application(middlewares=[auth])
    page, script, style = _static("index.html"), _static("console.js"), _static("console.css")

    async def index(_r: web.Request) -> web.Response:
        return web.Response(text=page, content_type="text/html")

    async def js(_r: web.Request) -> web.Response:
        return web.Response(text=script, content_type="application/javascript")

    async def css(_r: web.Request) -> web.Response:
        return web.Response(text=style, content_type="text/css")

    async def snapshot(_r: web.Request) -> web.Response:
        return web.json_response(state.snapshot())

    async def healthz(_r: web.Request) -> web.Response:
        return web.json_response({"ok": True, "bus_connected": state.bus_connected})

    async def events(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store"})
        await resp.prepare(request)
        seen, quiet = -1, 0.0
        try:
            while True:
                if state.version != seen:
                    seen = state.version
                    await resp.write(f"data: {json.dumps(state.snapshot())}\n\n".encode())
                    quiet = 0.0
                elif quiet >= KEEPALIVE_S:
                    await resp.write(b": keepalive\n\n")
                    quiet = 0.0
                await asyncio.sleep(PUSH_EVERY_S)
                quiet += PUSH_EVERY_S
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        return resp

    async def saga_svg(request: web.Request) -> web.Response:
        saga = request.match_info["saga"]
        row: dict[str, Any] = next((r for r in state.sagas if r.get("saga") == saga), {})
        history = feed.history(saga) if feed is not None else []
        if not row:
            raise web.HTTPNotFound(text=f"no saga {saga}")
        return web.Response(text=timeline_svg(row, history), content_type="image/svg+xml")

    app.router.add_get("/", index)
    app.router.add_get("/console.js", js)
    app.router.add_get("/console.css", css)
    app.router.add_get("/api/state", snapshot)
    app.router.add_get("/api/events", events)
    app.router.add_get("/api/sagas/{saga}/timeline.svg", saga_svg)
    app.router.add_get("/healthz", healthz)
    return app


async def serve(
    app: web.Application,
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    tls_cert: str | None = None,
    tls_key: str | None = None,
) -> tuple[web.AppRunner, str]:
    """Start serving; returns the runner (``await runner.cleanup()`` to stop) and the page's URL."""
    context = None
    if tls_cert:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(tls_cert, tls_key)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=context)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1] if port == 0 else port
    scheme = "https" if context else "http"
    shown = f"[{host}]" if ":" in host else host
    return runner, f"{scheme}://{shown}:{bound}/"
