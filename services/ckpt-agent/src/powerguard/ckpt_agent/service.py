"""The ckpt-agent service loop.

For now it connects to NATS, makes sure the stream and KV buckets exist, reports ready
and drains on SIGTERM; the service's own logic is added by its issue.
"""

from __future__ import annotations

import logging

from powerguard.bus import ServiceContext

log = logging.getLogger(__name__)


async def main(ctx: ServiceContext) -> None:
    ctx.set_ready(True)
    log.info("ckpt-agent ready")
    await ctx.stopping.wait()
