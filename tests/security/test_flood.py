"""Threat: a training job's agent credential (the least trusted on the bus) floods the one subject
it may fill, its own ack subject, during a real outage. Power events and every job's acks shared
one queue, and junk was dead-lettered one message at a time: 152 s into an outage there was no
saga, no checkpoint request for the other job and no shutdown. Now power events have their own
durable consumer, served first, and junk costs a decode: the other job's checkpoint request
arrives within twice its idle-bus time, and its node is shut down within the battery."""

from __future__ import annotations

import pytest

from .flood import FLOOD_ON, LOW_RUNTIME_S, rounds

pytestmark = pytest.mark.timeout(600)


async def test_a_jobs_flood_and_burst_delay_neither_the_other_jobs_request_nor_the_shutdown(deployment, tmp_path):
    got = await rounds(deployment, tmp_path, [("idle", False), ("idle", False), ("flood", True), ("burst", True)])
    idle = max(r.request_ms for r in got[:2])
    flood, burst = got[2], got[3]
    assert flood.junk_sent >= 5_000 and burst.junk_sent > 0
    for r in (flood, burst):
        assert r.request_ms <= 2 * max(idle, 50.0), f"{r.kind}: {r.request_ms} ms, idle {idle} ms"
        assert r.shutdown_s is not None and r.shutdown_s < LOW_RUNTIME_S - 5, f"{r.kind}: n2 off after {r.shutdown_s}s"


@pytest.mark.parametrize("kind", ["drill1mb", "acks64"])
async def test_a_flood_of_large_messages_closes_no_service_connection_and_delays_no_saga(deployment, tmp_path, kind):
    """Before: the operator's 1 MB junk on its drill power subject (or a job's 16 KiB junk over
    64 of its ranks' subjects) came to the coordinator in pulls without a byte cap, and the
    server closed its connection as a slow consumer (its lease and saga store with it): the real
    saga opened a minute late. Now the operator's messages are bounded by the server (its
    credential's payload limit), every pull carries ``max_bytes``, and a drill's readings have a
    durable of their own: the real saga's request arrives within 2 s of ``on_battery``."""
    before = deployment.varz().get("slow_consumers", 0)
    idle, flood = await rounds(deployment, tmp_path, [("idle", False), (kind, False)])
    assert flood.junk_sent >= FLOOD_ON[kind]
    bound = max(2_000.0, 2 * idle.request_ms)
    assert flood.request_ms <= bound, f"{kind}: {flood.request_ms} ms, idle {idle.request_ms}"
    assert deployment.varz().get("slow_consumers", 0) == before, "a connection was closed as a slow consumer"
