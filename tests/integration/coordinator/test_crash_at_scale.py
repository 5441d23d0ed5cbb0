"""A saga of 4096 ranks on 64 nodes: its record is stored as a head and parts (no KV value over
64 KiB), the coordinator is SIGKILLed holding it, and the restarted one completes the saga from
the parts with every command executed once and no part left behind."""

from __future__ import annotations

import pytest

from powerguard.coordinator.record_parts import PartLimits
from powerguard.coordinator.store import SagaStore
from powerguard.sim.agents import SimulatedRanks
from powerguard.sim.executor import SimulatedPowerControl

from .helpers import SagaWatch, drain_battery, eventually, outage, power_back, site_file
from .process import CoordinatorProcess

pytestmark = pytest.mark.integration

RANKS, PER_NODE = 4096, 64
NODES = [f"b{i:03d}" for i in range(RANKS // PER_NODE)]
JOBS = {"big": [NODES[r // PER_NODE] for r in range(RANKS)]}


async def part_keys(kv) -> list[str]:
    return [k for k in await kv.keys() if k.startswith("sagapart.")]


async def test_a_4096_rank_saga_in_parts_survives_sigkill_and_runs_every_command_once(
    make_bus, names, nats_server, tmp_path
):
    path = site_file(tmp_path / "site.yaml", names, NODES)
    sim, ctl, obs = await make_bus("sim"), await make_bus("power-control"), await make_bus("observer")
    ranks = SimulatedRanks(sim, JOBS, step=80)
    await ranks.start()
    executor = SimulatedPowerControl(ctl, resume_step={"big": 80})
    await executor.start()
    watch = await SagaWatch(obs).start()
    procs: list[CoordinatorProcess] = []
    try:
        procs.append(proc := await CoordinatorProcess(path, nats_server.url, "c1").start())
        await eventually(lambda: proc.said("leads site"), 20, "leadership")
        await outage(sim)
        await watch.reach("holding", 60)
        kv = await obs.sagas()
        ((before, _),) = await SagaStore(kv).load()
        assert before.acks() == (RANKS, RANKS)
        keys = await part_keys(kv)
        assert len(before.model_dump_json()) > PartLimits().inline_bytes, len(before.model_dump_json())
        assert len(keys) >= 2  # the record is in parts
        sizes = [len((await kv.get(k)).value) for k in [*keys, f"saga.{before.saga_id}"]]
        assert max(sizes) <= PartLimits().part_bytes + PartLimits().inline_bytes
        assert max(sizes[:-1]) <= PartLimits().part_bytes and sizes[-1] <= PartLimits().inline_bytes

        await proc.kill()
        procs.append(proc := await CoordinatorProcess(path, nats_server.url, "c1").start())
        await eventually(lambda: proc.said("resuming saga"), 30, "the restarted coordinator resumes the saga")
        await drain_battery(sim)
        await watch.reach("down", 60)
        await power_back(sim)
        await watch.reach("done", 60)
        assert await proc.stop() == 0

        store = SagaStore(kv)
        ((after, _),) = await store.load()
        assert after.trace_id == before.trace_id and after.acks() == (RANKS, RANKS)
        expected = sorted(
            [(n, "shutdown") for n in NODES] + [(n, "power_on") for n in NODES] + [("big", "stop"), ("big", "restart")]
        )
        assert sorted(executor.actions()) == expected  # every command executed exactly once
        assert len(executor.executed) == len(set(executor.executed))
        assert len(watch.states) == len(set(watch.states))
        live = await store.live_parts(after.saga_id)
        assert set(await part_keys(kv)) == live  # every replaced part was purged
    finally:
        for p in procs:
            await p.kill()
        await watch.stop()
        await executor.stop()
        await ranks.stop()
