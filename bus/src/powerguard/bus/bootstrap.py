"""``python -m powerguard.bus.bootstrap`` (= ``powerguard bootstrap``): the admin's one-time
JetStream setup — the stream, the KV buckets and every site's durable consumers with their final
configuration. Services never create or change them. Runs in any PowerGuard image (compose's
one-shot ``bootstrap`` service)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

from powerguard.schemas import PowerGuardError, load_site

from .client import Bus
from .env import PRECEDENCE, connection
from .errors import BusError
from .names import BusNames, StreamLimits

log = logging.getLogger("powerguard.bootstrap")


async def bootstrap(
    *,
    url: str,
    names: BusNames,
    sites: list[str],
    auth: dict,
    replicas: int = 1,
    update: bool = False,
    connect_timeout: float = 30.0,
) -> list[str]:
    """Create what is missing (``update``: also change the stream to this configuration). A
    credential other than the admin's is refused in words before anything is asked of the server
    (which would answer the first JetStream request it may not make with a timeout)."""
    from .connect_checks import require_credential

    require_credential(auth.get("creds_file"), "admin", command="powerguard bootstrap")
    bus = await Bus.connect(
        url,
        service="admin",
        names=names,
        limits=StreamLimits(replicas=replicas),
        setup=False,
        connect_timeout=connect_timeout,
        **auth,
    )
    try:
        return await bus.bootstrap(sites, update=update)
    finally:
        await bus.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m powerguard.bus.bootstrap", description=__doc__.split("\n\n")[0], epilog=PRECEDENCE
    )
    p.add_argument("--config", "--site", help="Site YAML (site name, NATS names and URL; --site: the same file)")
    p.add_argument(
        "--site-name",
        dest="site",
        action="append",
        default=[],
        help="More sites (by name) whose services use this stream",
    )
    p.add_argument("--nats-url", "--url", help="NATS URL(s) (default: env NATS_URL, the site file's)")
    p.add_argument("--creds", help="the admin credential (default: env NATS_CREDS, the site file's)")
    p.add_argument("--ca", help="CA of the server's certificate (default: env NATS_CA, the site file's)")
    p.add_argument(
        "--replicas", type=int, help="Stream and bucket replicas (default: env POWERGUARD_NATS_REPLICAS or 1)"
    )
    p.add_argument("--update", action="store_true", help="Also change an existing stream to this configuration")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cfg = load_site(args.config) if args.config else None
        sites = sorted({*args.site, *([cfg.site] if cfg else [])})
        if not sites:
            p.error("give --config site.yaml or --site")
        url, auth = connection(cfg.nats if cfg else None, url=args.nats_url, creds=args.creds, ca=args.ca)
        made = asyncio.run(
            bootstrap(
                url=url,
                names=BusNames.from_settings(cfg.nats) if cfg else BusNames(),
                sites=sites,
                auth=auth,
                replicas=args.replicas or int(os.environ.get("POWERGUARD_NATS_REPLICAS", "1")),
                update=args.update,
            )
        )
    except (BusError, PowerGuardError) as exc:
        log.error("%s", exc)
        return 1
    log.info("stream, KV buckets and durable consumers ready: %s", ", ".join(made))
    return 0


if __name__ == "__main__":
    sys.exit(main())
