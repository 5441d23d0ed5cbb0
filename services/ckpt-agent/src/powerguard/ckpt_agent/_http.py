"""``POST /api/v1/trigger_checkpoint``: the interface existing apcupsd/NUT scripts call
(``curl -X POST http://localhost:5000/api/v1/trigger_checkpoint``); it publishes a manual
checkpoint request for this job on the job's own trigger subject, which every rank then
honours at one step."""

from __future__ import annotations

import logging

from aiohttp import web

log = logging.getLogger("powerguard.ckpt_agent.http")


async def serve_trigger(bus_thread, *, port: int, host: str = "127.0.0.1") -> web.AppRunner:
    async def trigger(request: web.Request) -> web.Response:
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
