"""RNG states go into checkpoints as JSON, never pickle: restoring a checkpoint runs no code."""

from __future__ import annotations

import pickle
import random

import numpy as np
import pytest

from powerguard.ckpt_agent._state import (
    _numpy_rng_state,
    _packed,
    _python_rng_state,
    _set_numpy_rng_state,
    _set_python_rng_state,
    _unpacked,
)
from powerguard.ckpt_agent.errors import CorruptCheckpoint


def test_rng_states_round_trip_exactly():
    random.seed(7)
    np.random.seed(7)
    random.gauss(0, 1)
    np.random.standard_normal()  # a cached gaussian in both
    py, npy = _packed(_python_rng_state()), _packed(_numpy_rng_state())
    want = (random.random(), np.random.standard_normal())
    random.seed(1)
    np.random.seed(1)
    _set_python_rng_state(_unpacked(py))
    _set_numpy_rng_state(_unpacked(npy))
    assert (random.random(), np.random.standard_normal()) == want


class Boom:
    def __reduce__(self):
        return (exec, ("raise SystemExit('code ran')",))


def test_a_pickle_in_a_checkpoint_is_refused_not_run():
    evil = pickle.dumps(Boom())
    blob = _packed({"x": 1})
    raw = bytearray(blob.numpy().tobytes())
    raw[:8] = len(evil).to_bytes(8, "little")
    raw[8 : 8 + len(evil)] = evil
    import torch

    with pytest.raises(CorruptCheckpoint, match="not valid JSON"):
        _unpacked(torch.frombuffer(raw, dtype=torch.uint8))
