"""A few fixed seeds of the randomized fault campaign (bench/chaos.py runs a hundred): the
outage drill with a service SIGKILLed mid-shutdown, the broker restarted mid-hold and, on a
3-node cluster, the stream leader's node killed mid-hold, checked against the campaign's
invariants."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

_spec = importlib.util.spec_from_file_location("chaos", Path(__file__).resolve().parents[2] / "bench" / "chaos.py")
chaos = importlib.util.module_from_spec(_spec)
sys.modules["chaos"] = chaos  # dataclasses look their module up while the class is made
_spec.loader.exec_module(chaos)


@pytest.mark.parametrize(
    ("seed", "kinds", "kind", "phase"),
    [
        (1, chaos.FIRST_KINDS, "kill:coordinator", "shutdown"),
        (4, chaos.FIRST_KINDS, "nats-restart", "hold"),
        (7, chaos.FIRST_KINDS, "kill:power-control", "shutdown"),
        (74, chaos.KINDS, "nats-leader-loss", "hold"),  # a 3-node cluster loses the stream leader's node
    ],
)
async def test_fixed_chaos_seed_keeps_every_invariant(seed, kinds, kind, phase, tmp_path):
    run = await chaos.one(seed, tmp_path, steps=250, kinds=kinds)
    assert (run.fault.kind, run.fault.phase) == (kind, phase), "the seed no longer draws this fault"
    assert run.injected_at is not None, "the fault was never injected"
    assert run.violations == [], f"seed {seed} ({kind} in {phase}): {run.violations}"
