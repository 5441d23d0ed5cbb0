"""The service runner: config, logs, tracing, health/metrics server, NATS connection,
signal handling and graceful drain. Every service's ``__main__`` is a few lines on top."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from powerguard.schemas import ConfigError, PowerGuardError, SiteConfig, load_site

from .client import Bus
from .env import PRECEDENCE, auth_options, connection, secured
from .http import HealthServer
from .logs import configure_logging
from .names import BusNames, StreamLimits
from .tracing import configure_tracing

log = logging.getLogger(__name__)


@dataclass
class ServiceContext:
    name: str
    bus: Bus
    site: SiteConfig | None
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    http_port: int | None = None
    args: argparse.Namespace | None = None
    _ready: bool = False
    _reason: str = "starting"

    def set_ready(self, ready: bool = True, reason: str = "") -> None:
        self._ready, self._reason = ready, reason or ("ok" if ready else "not ready")

    def readiness(self) -> tuple[bool, str]:
        if not self.bus.connected:
            return False, "NATS disconnected"
        return self._ready, self._reason


@dataclass
class ReadyLog:
    """A service's readiness as it says it: handed to ``set_ready`` (the health server's
    /readyz) every time, and one log line whenever the reason changes (INFO ready, ERROR not):
    ``<who> ready<where>: <reason>``."""

    who: str
    set_ready: Callable[[bool, str], None] | None = None
    where: str = ""  # e.g. " for site dc1"
    logger: logging.Logger = log
    said: str = ""

    def __call__(self, ready: bool, reason: str) -> None:
        if self.set_ready is not None:
            self.set_ready(ready, reason)
        if reason != self.said:
            say = self.logger.info if ready else self.logger.error
            say("%s %s%s: %s", self.who, "ready" if ready else "NOT ready", self.where, reason)
            self.said = reason


Main = Callable[[ServiceContext], Awaitable[None]]


async def run_service(
    name: str,
    main: Main,
    *,
    nats_url: str,
    site: SiteConfig | None = None,
    http_host: str = "127.0.0.1",
    http_port: int | None = None,
    names: BusNames | None = None,
    drain_timeout: float = 10.0,
    stop_event: asyncio.Event | None = None,
    args: argparse.Namespace | None = None,
    auth: dict | None = None,
) -> int:
    """Run ``main`` until it returns or SIGTERM/SIGINT; then drain. Returns an exit code."""
    from .creds import expiry_of
    from .metrics import CREDENTIAL_EXPIRY
    from .version import announce

    log.info("powerguard-%s %s starting", name, announce(name))
    nats = site.nats if site else None
    # one site file for every service, one NATS identity per service: the environment may name it
    auth = auth if auth is not None else auth_options(nats)
    expires = expiry_of(auth.get("creds_file"))
    if expires is not None:
        CREDENTIAL_EXPIRY.labels(name).set(expires)
    replicas = int(os.environ.get("POWERGUARD_NATS_REPLICAS", "1"))
    bus = await Bus.connect(
        nats_url,
        limits=StreamLimits(replicas=replicas),
        service=name,
        names=names or (BusNames.from_settings(nats) if nats else BusNames()),
        setup=not secured(auth),  # with a credential the stream comes from `powerguard bootstrap`
        **auth,
    )
    ctx = ServiceContext(name=name, bus=bus, site=site, stopping=stop_event or asyncio.Event(), args=args)
    health = None
    if http_port is not None:
        health = HealthServer(host=http_host, port=http_port, ready=ctx.readiness)
        ctx.http_port = await health.start()
        log.info("health and metrics on http://%s:%d", http_host, ctx.http_port)

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, ctx.stopping.set)
        except (NotImplementedError, RuntimeError):  # not the main thread
            pass
    code = 0
    task = asyncio.create_task(main(ctx), name=f"{name}:main")
    stop_wait = asyncio.create_task(ctx.stopping.wait())
    try:
        await asyncio.wait({task, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            log.info("stopping: draining (up to %.0fs)", drain_timeout)
            ctx.set_ready(False, "stopping")
            try:
                await asyncio.wait_for(asyncio.shield(task), drain_timeout)
            except TimeoutError:
                task.cancel()
        if task.done() and not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            log.error("%s failed: %s", name, exc, exc_info=exc)
            code = 1
    finally:
        stop_wait.cancel()
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.remove_signal_handler(sig)
            except (NotImplementedError, RuntimeError):
                pass
        await bus.drain()
        if health:
            await health.stop()
    log.info("%s stopped", name)
    return code


def service_parser(name: str, description: str, default_port: int) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"python -m powerguard.{name.replace('-', '_')}",
        description=description,
        epilog=f"{PRECEDENCE} Give each service its own credential (creds/{name}.creds): its identity on the bus "
        "is what the server lets it say. Every flag has an environment variable: POWERGUARD_CONFIG, NATS_URL, "
        "NATS_CREDS, NATS_CA, POWERGUARD_HTTP_HOST, POWERGUARD_HTTP_PORT, POWERGUARD_LOG_LEVEL.",
    )
    p.add_argument(
        "--config",
        "-c",
        metavar="SITE_YAML",
        default=os.environ.get("POWERGUARD_CONFIG"),
        help="site YAML (topology, devices, service sections: docs/architecture.md); env POWERGUARD_CONFIG",
    )
    p.add_argument(
        "--nats-url",
        "--url",
        default=None,
        help="NATS server URL(s), comma-separated for a cluster (default: env NATS_URL, the site file's nats.url)",
    )
    p.add_argument(
        "--creds",
        metavar="FILE",
        default=None,
        help=f"this service's NATS credential (default: env NATS_CREDS, the site file's nats.creds_file): "
        f"creds/{name}.creds from `powerguard creds init`",
    )
    p.add_argument(
        "--ca",
        metavar="PEM",
        default=None,
        help="CA that signed the server's certificate (default: env NATS_CA, the site file's nats.tls_ca)",
    )
    p.add_argument(
        "--http-host",
        default=os.environ.get("POWERGUARD_HTTP_HOST", "127.0.0.1"),
        help="address for /healthz, /readyz, /metrics (default 127.0.0.1)",
    )
    p.add_argument(
        "--http-port",
        type=int,
        default=int(os.environ.get("POWERGUARD_HTTP_PORT", default_port)),
        help=f"port for /healthz, /readyz, /metrics; 0 picks a free one (default {default_port})",
    )
    from .version import version

    p.add_argument("--version", action="version", version=f"powerguard-{name} {version(name)}")
    p.add_argument(
        "--log-level",
        default=os.environ.get("POWERGUARD_LOG_LEVEL", "INFO"),
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="log level (default INFO)",
    )
    return p


def service_main(
    name: str,
    main: Main,
    *,
    description: str,
    default_port: int,
    argv: list[str] | None = None,
    extend: Callable[[argparse.ArgumentParser], None] | None = None,
    check: Callable[[SiteConfig], object] | None = None,
) -> int:
    """Parse the standard flags, set up logs and tracing, run the service. ``check`` validates
    the service's own section of the site file before anything connects: a bad value exits
    with status 2 and a ConfigError naming the field, never a traceback."""
    parser = service_parser(name, description, default_port)
    if extend:
        extend(parser)
    args = parser.parse_args(argv)
    configure_logging(name, args.log_level)
    provider = configure_tracing(f"powerguard-{name}")
    try:
        return _run(name, main, parser, args, check)
    finally:
        provider.shutdown()  # exports the spans still queued: the outage trace must be complete


def _run(name: str, main, parser: argparse.ArgumentParser, args: argparse.Namespace, check=None) -> int:
    try:
        site = load_site(args.config) if args.config else None
        if check is not None:
            if site is None:
                raise ConfigError(f"{name} needs --config site.yaml")
            check(site)
    except PowerGuardError as exc:
        parser.exit(2, f"error: {exc}\n")
    # the environment overrides the shared site file (one file, many deployments); a comma-separated
    # list names every server of a cluster
    url, auth = connection(site.nats if site else None, url=args.nats_url, creds=args.creds, ca=args.ca)
    try:
        return asyncio.run(
            run_service(
                name,
                main,
                nats_url=url,
                auth=auth,
                site=site,
                args=args,
                http_host=args.http_host,
                http_port=args.http_port,
            )
        )
    except PowerGuardError as exc:
        log.error("%s", exc)
        return 1
