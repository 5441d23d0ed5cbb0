"""A 3-node NATS JetStream cluster on loopback, for tests that lose a node."""

from __future__ import annotations

import contextlib
from pathlib import Path

from powerguard.bus import Bus, BusNames, embedded_cluster
from powerguard.bus.names import StreamLimits
from tests.waiting import eventually


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

    async def connected() -> Bus | None:  # the JetStream meta leader is elected seconds after the routes connect
        try:
            return await Bus.connect(urls, service=service, names=names, limits=StreamLimits(replicas=3))
        except Exception:
            return None

    return await eventually(connected, 30, "a connection with JetStream to the cluster", every=0.5)
