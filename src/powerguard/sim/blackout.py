"""The blackout drill's outage (``powerguard demo --blackout``): the outage outlasts the battery.

utility fails → on battery → every rank's checkpoint durable → the hold → the final checkpoint
and the shutdown → every node off → the coordinator tells the UPS to cut its output and turn it
on again when mains returns (``coordinator.ups_off``, here by the site limit
``ups_off_after_s``) → the output goes off: **the whole site loses power**, the broker and
PowerGuard's own services included (every process SIGKILLed; the broker's store and the
checkpoint disks drop what was not durable, on the power-cut filesystem) → mains returns → the
UPS turns its output on → the PDU's outlets come on, every BMC boots its node by its restore
policy, the broker starts on what it kept, the services start as at boot → they read the
durable saga and finish it: the nodes are ready, the job restarts from its newest durable
checkpoint.

Nothing here tells the site what to do: the drill only plays the physical world (mains, the
UPS's output, what loses power with it) and watches the bus.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from powerguard.schemas import (
    CheckpointDurable,
    NodeState,
    OnBattery,
    SagaState,
    SagaStateChanged,
    UpsOutputOffRequested,
    UpsOutputResult,
)

from .errors import DrillError

DARK_S = 3.0  # how long the site stays without power once the UPS's output is off (mains still out)


async def blackout_outage(
    site,
    obs,
    *,
    say: Callable[..., None],
    job: str,
    world: int,
    until: Callable[..., Awaitable[Any]],
    detach: Callable[[], Awaitable[None]],
    attach: Callable[[], Awaitable[None]],
    progress: Callable[[], dict[int, int]],
    lines: Callable[[], list],
) -> dict:
    """One outage longer than the battery; the times of its stages (``stages``: name → time)."""
    assert site.output is not None, "the site was not started with blackout"
    stages: dict[str, float] = {}
    t_fail = stages["utility fails"] = time.time()
    site.utility(on=False)
    say("outage", "utility power FAILS: the UPS is on battery, and mains will not return before it is empty", t_fail)
    t_det = stages["on battery detected"] = await until(obs, lambda: obs.first(OnBattery), 30, "on_battery", site)
    step_at_detection = max(progress().values())
    acked = lambda: len(obs.acked(job)) >= world  # noqa: E731
    await until(obs, acked, 90, "every rank's checkpoint ack", site)
    t_acked = stages["every rank's checkpoint durable"] = max(
        t for t, _ in obs.of(CheckpointDurable, lambda e: e.data.job == job)
    )

    def off() -> bool:
        return len({e.data.node for _, e in obs.of(NodeState, lambda e: e.data.state == "off")}) >= len(site.node_names)

    await until(obs, off, 90, "every node off", site)
    stages["every node off"] = max(t for t, e in obs.of(NodeState, lambda e: e.data.state == "off"))
    stop_at = len(lines())
    stages["the UPS told to cut its output"] = await until(
        obs, lambda: obs.first(UpsOutputOffRequested), 60, "the coordinator to tell the UPS to cut its output", site
    )
    result = await until(obs, lambda: obs.of(UpsOutputResult), 30, "the UPS's answer", site)
    t_answer, answer = result[0]
    if not answer.data.ok:
        raise DrillError(f"the UPS refused to cut its output: {answer.data.error}")
    stages["the UPS confirmed"] = t_answer
    say("power", f"ups-a: {answer.data.detail}")
    await until(obs, lambda: not site.output.is_on(), 60, "the UPS's output to go off", site)
    stages["the UPS's output off: the site loses all power"] = time.time()
    await detach()
    site.power_lost()
    how = (
        "their unsynced writes dropped by the power-cut filesystem"
        if site.disks
        else f"SIGKILL alone: {site.powercut_unavailable}"
    )
    say("outage", f"the UPS's output is OFF: the whole site is dark, broker and services included ({how})")
    await asyncio.sleep(DARK_S)  # the outage goes on past the battery: nothing runs to be waited for
    t_ret = stages["utility returns"] = time.time()
    site.utility(on=True)
    say("outage", "utility power RETURNS", t_ret)
    await until(obs, site.output.is_on, 30, "the UPS to turn its output on again", site)
    stages["the UPS's output on"] = time.time()
    site.power_returned()
    stages["the broker up on what it kept"] = time.time()
    say("power", "power is back: PDU outlets on, each BMC boots its node (restore policy always-on), the broker starts")
    await attach()
    site.start_services()
    stages["PowerGuard's services started"] = time.time()
    say("setup", "PowerGuard's services start, as their supervisor does at boot (systemd, compose)")
    saga_end = lambda: obs.first(SagaStateChanged, lambda e: e.data.state in (SagaState.DONE, SagaState.FAILED))  # noqa: E731
    stages["the saga finished"] = await until(obs, saga_end, 180, "the saga to finish after the blackout", site)
    return {
        "t_fail": t_fail,
        "t_det": t_det,
        "t_acked": t_acked,
        "t_ret": t_ret,
        "step_at_detection": step_at_detection,
        "stop_at": stop_at,
        "stages": stages,
    }


def blackout_figures(stages: dict[str, float], lines: list[tuple[int, int, float]], *, stop_at: int) -> dict:
    """The stages as seconds since utility failed, and mains → the first training step after it."""
    t_fail, t_ret = stages["utility fails"], stages["utility returns"]
    after = [t for _, _, t in lines[stop_at:] if t >= t_ret]
    first = min(after) if after else None
    if first is not None:
        stages = {**stages, "first training step": first}
    return {
        "stages": [{"stage": k, "at_s": round(v - t_fail, 3)} for k, v in sorted(stages.items(), key=lambda kv: kv[1])],
        "mains_to_first_step_s": round(first - t_ret, 3) if first is not None else None,
    }
