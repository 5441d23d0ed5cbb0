"""``POST /api/v1/trigger_checkpoint``: the interface existing apcupsd/NUT scripts call
(``curl -X POST -H 'Content-Type: application/json' -d '{}' http://localhost:5000/api/v1/trigger_checkpoint``);
it publishes a manual checkpoint request for this job on the job's own trigger subject, which
every rank then honours at one step.

It listens on loopback, where a web page in a browser on the node reaches it too: it takes only
``Content-Type: application/json`` (a page can send that across sites only after a CORS
preflight, which it never answers), only a ``Host`` and ``Origin`` that name loopback (no DNS
rebinding), and with ``POWERGUARD_TRIGGER_TOKEN`` (or ``..._FILE``) set, only a request that
carries it (``Authorization: Bearer``); :mod:`powerguard.bus.http_guard`, as the console."""

from __future__ import annotations

import logging

from aiohttp import web

from powerguard.bus.env import env_secret
from powerguard.bus.http_guard import LOOPBACK, authorized, host_refusal

log = logging.getLogger("powerguard.ckpt_agent.http")


def refusal(request: web.Request, token: str | None) -> web.Response | None:
    """The answer to a request the trigger must not take (None: take it)."""
    if (why := host_refusal(request, LOOPBACK, what="the checkpoint trigger")) is not None:
        return web.json_response({"error": why}, status=421)
    if not authorized(request, token):
        return web.json_response(
            {"error": "a token is required: Authorization: Bearer <POWERGUARD_TRIGGER_TOKEN>"},
            status=401,
            headers={"WWW-Authenticate": 'Bearer realm="powerguard trigger"'},
        )
    if request.content_type != "application/json":
        return web.json_response(
            {"error": f"Content-Type must be application/json, not {request.content_type!r} (send -d '{{}}')"},
            status=415,
        )
    return None


async def serve_trigger(bus_thread, *, port: int, host: str = "127.0.0.1", token: str | None = None) -> web.AppRunner:
    token = token if token is not None else env_secret("POWERGUARD_TRIGGER_TOKEN")

    async def trigger(request: web.Request) -> web.Response:
        if (refused := refusal(request, token)) is not None:
            log.warning("trigger request refused (%s)", refused.text)
            return refused
        try:
            body = await request.json() if request.can_read_body else {}
        except ValueError:
            return web.json_response({"error": "body must be JSON (or empty)"}, status=400)
        deadline_s = body.get("deadline_s", 300) if isinstance(body, dict) else 300
        if isinstance(deadline_s, bool) or not isinstance(deadline_s, int | float) or not 0 < deadline_s <= 86400:
            return web.json_response({"error": "deadline_s must be a number of seconds in (0, 86400]"}, status=400)
        from datetime import timedelta

        from powerguard.schemas import CheckpointRequestData, CheckpointTriggered, new_id, utcnow

        rid = f"manual-{new_id()}"
        event = CheckpointTriggered(
            source=bus_thread.source,
            data=CheckpointRequestData(
                request_id=rid,
                job=bus_thread.agent.job,
                reason="manual",
                deadline=utcnow() + timedelta(seconds=deadline_s),
            ),
        )
        await bus_thread.bus.publish(event)
        log.info("manual checkpoint requested over HTTP: %s", rid)
        return web.json_response({"request_id": rid, "job": bus_thread.agent.job}, status=202)

    app = web.Application()
    app.router.add_post("/api/v1/trigger_checkpoint", trigger)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    sockets = site._server.sockets if site._server else []  # type: ignore[union-attr]
    bus_thread.http_port = sockets[0].getsockname()[1] if sockets else port
    log.info("trigger endpoint on http://%s:%d/api/v1/trigger_checkpoint", host, bus_thread.http_port)
    return runner
