"""A few fixed seeds of the randomized fault campaign (bench/chaos.py runs a hundred): the
outage drill with a service SIGKILLed mid-shutdown and the broker restarted mid-hold, checked
against the campaign's invariants."""

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
    ("seed", "kind", "phase"),
    [(1, "kill:coordinator", "shutdown"), (4, "nats-restart", "hold"), (7, "kill:power-control", "shutdown")],
)
async def test_fixed_chaos_seed_keeps_every_invariant(seed, kind, phase, tmp_path):
    run = await chaos.one(seed, tmp_path, steps=250)
    assert (run.fault.kind, run.fault.phase) == (kind, phase), "the seed no longer draws this fault"
    assert run.injected_at is not None, "the fault was never injected"
    assert run.violations == [], f"seed {seed} ({kind} in {phase}): {run.violations}"
