"""power-control learns a saga's state from the coordinator's own events, never from the
coordinator's KV records: its credential may read the newest ``pg.saga.<id>`` event (a
direct get) and nothing of ``pg_sagas``; only the coordinator may publish a saga's state.
The operator tools (observer, operator) read the status the coordinator publishes
(``pg_status``) and nothing of its records; only the coordinator writes a status."""

from __future__ import annotations

import pytest

from powerguard.bus.saga_status import saga_statuses
from powerguard.schemas import SagaData, SagaStateChanged, SagaStatus

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


async def test_tools_read_the_published_status_and_nothing_of_the_coordinators_records(deployment):
    dep = deployment
    coord = await dep.connect("coordinator", service="coordinator-status")
    status = SagaStatus(saga="s2", site=SITE, state="holding", published_at=1.0, started=1.0, state_at=1.0)
    await (await coord.status_board()).put(coord.names.status_key("s2"), status.model_dump_json(by_alias=True).encode())
    await (await coord.sagas()).put(coord.names.saga_key("s2"), {"saga_id": "s2", "state": "holding"})
    for role in ("observer", "operator"):
        tool = await dep.connect(role)
        assert [s.saga for s in await saga_statuses(tool)] == ["s2"], role
        names = tool.names
        await refused(tool.js.get_last_msg(f"KV_{names.sagas}", f"$KV.{names.sagas}.{names.saga_key('s2')}"))
    for role in ("observer", "operator", "power-control", "ups-monitor"):
        other = await dep.connect(role)
        forged = status.model_copy(update={"state": "done"}).model_dump_json(by_alias=True).encode()
        subject = f"$KV.{other.names.status}.{other.names.status_key('s2')}"
        assert await refused(other.js.publish(subject, forged, timeout=1)), role
    agent = await dep.connect("agent", job="jobA")
    assert await refused(agent.js.publish(f"$KV.{agent.names.status}.{agent.names.status_key('s2')}", b"{}", timeout=1))
    reader = await dep.connect("observer")
    (only,) = await saga_statuses(reader)
    assert only.state == "holding"  # nobody but the coordinator changed it
