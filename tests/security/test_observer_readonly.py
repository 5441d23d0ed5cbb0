"""Threat: the observer's credential (given to outside tools: dashboards, exporters) creates a
named durable consumer of its own, or changes a service's, or has the server deliver stored
records into subjects of its choice (a push consumer on the agents' KV stream delivering the
agent-written bodies onto a power event subject, which it then listens to).

The server enforces: consumers only through the create endpoint without a name in its subject
(which refuses a durable), so nothing of the observer's outlives it and no service's consumer is
touched; the observer subscribes to its inbox only, so a push consumer it points elsewhere finds
none of its interest and delivers nothing. Reading works as it is for: ephemeral pull consumers on
the stream, ordered consumers (KV keys and watches)."""

from __future__ import annotations

import asyncio
import json

from nats.js import api

from powerguard.schemas import AgentData, OnBattery

from .conftest import SITE, refused
from .services import outage, reading


async def test_4_the_observer_creates_no_durable_and_changes_no_service_consumer(deployment):
    dep = deployment
    observer = await dep.connect("observer")
    admin = await dep.connect("admin", service="admin-check")
    stream, durable = dep.names.stream, f"coordinator-{SITE}"
    before = await admin.js.consumer_info(stream, durable)
    # a durable of its own, by each endpoint: refused by its permissions, or by the server itself
    await refused(observer.js.add_consumer(stream, api.ConsumerConfig(durable_name="mine")))
    await refused(observer.js.add_consumer(stream, api.ConsumerConfig(name="mine", inactive_threshold=3600.0)))
    legacy = f"$JS.API.CONSUMER.CREATE.{stream}"
    as_durable = {"stream_name": stream, "config": {"durable_name": "mine", "ack_policy": "explicit"}}
    reply = json.loads((await observer.nc.request(legacy, json.dumps(as_durable).encode(), timeout=5)).data)
    assert "expected to be ephemeral" in reply["error"]["description"], reply
    # a service's durable, by its name inside the request: not changed
    hijack = {"stream_name": stream, "config": {"name": durable, "filter_subject": "pg.nothing", "ack_policy": "none"}}
    reply = json.loads((await observer.nc.request(legacy, json.dumps(hijack).encode(), timeout=5)).data)
    assert "error" in reply, reply
    after = await admin.js.consumer_info(stream, durable)
    assert after.config.filter_subjects == before.config.filter_subjects
    assert after.config.durable_name == durable
    names = [c.name for c in await admin.js.consumers_info(stream)]
    assert "mine" not in names, names


async def test_4_a_push_consumer_the_observer_points_at_a_power_subject_delivers_nothing(deployment):
    dep = deployment
    observer = await dep.connect("observer")
    agent = await dep.connect("agent", job="jobA")
    admin = await dep.connect("admin", service="admin-check")
    # an agent-written record whose body is a valid power event
    fake = OnBattery(data=reading(True, 30))
    kv = await agent.agents()
    await kv.raw.put("jobA.n1.0", fake.model_dump_json().encode())
    target = fake.nats_subject(dep.names.subjects)
    # the observer listens there (the server refuses the subscription: its inbox only) ...
    await observer.nc.subscribe(target)
    await observer.nc.flush()
    # ... and points a push consumer on the agents' stream at it: no interest, nothing delivered
    cfg = api.ConsumerConfig(
        deliver_subject=target, deliver_policy=api.DeliverPolicy.ALL, ack_policy=api.AckPolicy.NONE
    )
    info = await observer.js.add_consumer(f"KV_{dep.names.agents}", cfg)
    state = await admin.js.consumer_info(f"KV_{dep.names.agents}", info.name)
    assert not state.push_bound and state.delivered.stream_seq == 0 and state.num_pending >= 1, state
    stored = await admin.js.stream_info(dep.names.stream, subjects_filter=target)
    assert not (stored.state.subjects or {}), stored.state.subjects


async def test_4_the_observer_reads_the_stream_and_the_buckets(deployment):
    """The legitimate reads: an ephemeral pull consumer on the events, KV keys and a watch."""
    dep = deployment
    ups = await dep.connect("ups-monitor")
    observer = await dep.connect("observer")
    agent = await dep.connect("agent", job="jobA")
    await (await agent.agents()).put("jobA.n1.0", AgentData(job="jobA", rank=0, world_size=1, node="n1"))
    await outage(ups)
    sub = await observer.subscribe(OnBattery, deliver="all").start()
    assert (await asyncio.wait_for(sub.__anext__(), 10)).data.ups == "ups-a"
    await sub.aclose()
    assert await (await observer.agents()).keys() == ["jobA.n1.0"]
