"""power-control learns a saga's state from the coordinator's own events, never from the
coordinator's KV records: its credential may read the newest ``pg.saga.<id>`` event (a
direct get) and nothing of ``pg_sagas``; only the coordinator may publish a saga's state."""

from __future__ import annotations

import pytest

from powerguard.schemas import SagaData, SagaStateChanged

from .conftest import SITE, refused

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


async def test_power_control_reads_a_sagas_state_from_its_events_and_not_the_coordinators_records(deployment):
    dep = deployment
    coord = await dep.connect("coordinator", service="coordinator-states")
    pc = await dep.connect("power-control")
    await coord.publish(SagaStateChanged(data=SagaData(saga_id="s1", site=SITE, state="down")))
    kv = await coord.sagas()
    await kv.put(coord.names.saga_key("s1"), {"saga_id": "s1", "state": "down"})
    got = await pc.last(pc.subjects.saga("s1"))  # the newest state the coordinator announced
    assert got is not None and isinstance(got.event, SagaStateChanged) and got.event.data.state == "down"
    # the coordinator's record of the same saga: refused to power-control by the server
    await refused(pc.js.get_last_msg(f"KV_{pc.names.sagas}", f"$KV.{pc.names.sagas}.{pc.names.saga_key('s1')}"))
    # and nobody but the coordinator announces a saga's state: power-control's credential cannot
    await refused(pc.publish(SagaStateChanged(data=SagaData(saga_id="s1", site=SITE, state="restoring")), timeout=1))
