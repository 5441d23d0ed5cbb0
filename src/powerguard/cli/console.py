"""``powerguard console``: serve the operator console until SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import signal

from powerguard.bus import Bus, BusError, BusNames
from powerguard.bus.env import auth_options
from powerguard.schemas import SiteConfig

log = logging.getLogger("powerguard.console")

STOP_STEP_S = 20.0


async def start_console(
    *,
    url: str,
    site: SiteConfig | None,
    host: str = "127.0.0.1",
    port: int = 8080,
    token: str | None = None,
    tls_cert: str | None = None,
    tls_key: str | None = None,
    trace_url: str | None = None,
    creds: str | None = None,
    auth: dict | None = None,
    allowed_hosts: tuple[str, ...] = (),
):
    """Connect (read-only), start the feed and the web server; returns (stop coroutine fn, URL)."""
    from powerguard.console import ConsoleState, Feed, make_app, serve

    auth = dict(auth) if auth is not None else auth_options(site.nats if site is not None else None)
    if creds:
        auth["creds_file"] = creds
    names = BusNames.from_settings(site.nats) if site is not None else BusNames()
    bus = await Bus.connect(url, service="console", names=names, setup=False, **auth)
    state = ConsoleState(trace_url=trace_url)
    feed = Feed(bus, state, site=site)
    await feed.start()
    runner, page = await serve(
        make_app(state, feed, token=token, allowed_hosts=(*allowed_hosts, host)),
        host=host,
        port=port,
        tls_cert=tls_cert,
        tls_key=tls_key,
    )

    async def stop() -> None:
        """Each step bounded and logged: stopping the console never hangs its caller (the demo
        stops the site after it)."""
        for what, step in (("web server", runner.cleanup), ("feed", feed.stop), ("NATS connection", bus.close)):
            try:
                await asyncio.wait_for(step(), STOP_STEP_S)
            except TimeoutError:
                log.error("console's %s did not stop within %.0f s; left behind", what, STOP_STEP_S)
            except (OSError, BusError) as exc:  # the server went first: nothing left to close cleanly
                log.info("console's %s closed with %r", what, exc)

    return stop, page


async def run_console(target, **options) -> None:
    """Serve until SIGINT/SIGTERM; ``target`` is where and as whom (``cli._conn.target``)."""
    from powerguard.bus.version import announce

    stop, page = await start_console(url=target.url, site=target.site, auth=target.auth, **options)
    print(f"PowerGuard console {announce('console')}: {page}", flush=True)
    try:
        await until_interrupted()
    finally:
        await stop()


async def until_interrupted() -> None:
    """Wait for SIGINT or SIGTERM (then leave the handlers as they were)."""
    done = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, done.set)
    try:
        await done.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
