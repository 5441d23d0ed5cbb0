"""A 3-node NATS JetStream cluster on loopback, for tests that lose a node."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

from powerguard.bus import Bus, BusNames, embedded_cluster
from powerguard.bus.names import StreamLimits


@contextlib.contextmanager
def nats_cluster(tmp_path: Path, size: int = 3):
    nodes = embedded_cluster(tmp_path, size)
    try:
        for n in nodes:
            n.start()
        yield nodes
    finally:
        for n in nodes:
            with contextlib.suppress(Exception):
                n.stop()


async def connect(nodes, service: str, names: BusNames) -> Bus:
    urls = [n.url for n in nodes]
    deadline = time.monotonic() + 30
    while True:  # the JetStream meta leader is elected a few seconds after the routes connect
        try:
            return await Bus.connect(urls, service=service, names=names, limits=StreamLimits(replicas=3))
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)
