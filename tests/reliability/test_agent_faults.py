"""The ckpt-agent never takes the training down: a request whose deadline has passed (the
coordinator sends such at low battery) and a broker that is not there when training starts
are reported, not raised into the user's loop. Real 2-rank torch.distributed jobs."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from powerguard.schemas import CheckpointDurable, CheckpointFailed, CheckpointRequestData, CheckpointRequested, utcnow
from tests.integration.ckpt.runner import Trainer
from tests.integration.ckpt.test_agent import registered
from tests.integration.ups.nut_peer import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


async def test_a_request_past_its_deadline_is_answered_and_training_goes_on(bus, nats_server, tmp_path):
    acks = bus.subscribe(CheckpointDurable, CheckpointFailed, deliver="all")
    await acks.start()
    t = await Trainer(tmp_path, "jlate", nats_url=nats_server.url, names=bus.names, steps=150, step_sleep=0.02).start()
    try:
        await registered(bus, "jlate")
        late = CheckpointRequestData(
            request_id="late-1", saga_id="s-late", job="jlate", deadline=utcnow() - timedelta(seconds=5)
        )
        await bus.publish(CheckpointRequested(data=late))
        answers = []

        async def collect() -> None:
            async for ev in acks:
                if ev.data.request_id == "late-1":
                    answers.append(ev)
                    if len({a.data.rank for a in answers}) == 2:
                        return

        await asyncio.wait_for(collect(), 60)
        assert await t.wait(180) == 0, t.output()[-3000:]  # the loop was never interrupted
    finally:
        await t.kill()
        await acks.aclose()
    assert {a.data.rank for a in answers} == {0, 1}


async def test_training_starts_when_nats_is_down(tmp_path):
    dead = f"nats://127.0.0.1:{free_port()}"
    from powerguard.bus import BusNames

    t = await Trainer(tmp_path, "jnonats", nats_url=dead, names=BusNames(), steps=30).start()
    assert await t.wait(180) == 0, t.output()[-3000:]
    assert "NATS not reachable" in t.output() and "training starts" in t.output()
