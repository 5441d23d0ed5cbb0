"""The health exporter runs with the observer's credential (as documented and as its unit ships):
it sees every bucket that exists, with no permission violation, while the observer still reads
no value of the buckets it was not given (pg_ups holds the event-id secret)."""

from __future__ import annotations

import logging

from powerguard.bus.health import collect

from .conftest import SITE, refused


async def test_the_exporter_with_the_observer_credential_sees_every_bucket(deployment, caplog):
    caplog.set_level(logging.WARNING)
    observer = await deployment.connect("observer")
    snap = await collect(observer, SITE, timeout_s=2.0)
    names = deployment.names
    assert set(snap.kv) == {names.sagas, names.status, names.agents, names.leases, names.ups, names.power, names.floors}
    assert all(v is not None for v in snap.kv.values()), snap.kv  # each bucket exists and was read
    assert all(c["present"] == 1 for c in snap.consumers.values()), snap.consumers
    assert not caplog.records, caplog.text
    # stream info only: a value of pg_ups or pg_power is still refused
    ups = await deployment.connect("ups-monitor")
    await (await ups.kv(names.ups)).put("dc1.ups1", {"flags": {}, "seq": 1})
    assert await refused(observer.js.get_last_msg(f"KV_{names.ups}", f"$KV.{names.ups}.dc1.ups1"))
