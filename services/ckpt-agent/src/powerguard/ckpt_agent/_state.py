"""What a checkpoint holds: the model, optimizer, scheduler, extra and per-rank state, and
every RNG (torch, CUDA, Python, NumPy) as tensors. JSON, never pickle: loading runs no code."""

from __future__ import annotations

import json
import random
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful

from .errors import CheckpointError, CorruptCheckpoint

STEP_KEY = "powerguard.step"


class TrainingState:
    """What one rank checkpoints and restores: the objects the training passed in, read at
    save time and written back on restore (extras that are plain values are replaced)."""

    def __init__(
        self,
        *,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None,
        scheduler: Any | None,
        extra_state: dict[str, Any] | None,
        rank_state: dict[str, Any] | None,
        rank: int,
    ) -> None:
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        # the caller's own dicts, live: what they hold at a save is saved, a restore writes into them
        self.extra_state = extra_state if extra_state is not None else {}
        self.rank_state = rank_state if rank_state is not None else {}
        self.rank = rank
        self.frozen_rng: dict[str, Any] | None = None  # a quiescent phase: the RNG as it entered

    def freeze_rng(self) -> None:
        """Save the RNG as it is now until :meth:`thaw_rng`: inside a quiescent phase the training
        thread may draw numbers (an evaluation's sampler) while a checkpoint of the last step runs."""
        self.frozen_rng = self._rng()

    def thaw_rng(self) -> None:
        self.frozen_rng = None

    def state_dict(self, step: int) -> dict[str, Any]:
        """The state dict of ``step`` (a DCP save writes it; a load fills a fresh one in place)."""
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer if self.optimizer is not None else [])
        sd: dict[str, Any] = {"model": model_sd, STEP_KEY: step}
        if self.optimizer is not None:
            sd["optim"] = optim_sd
        if self.scheduler is not None:
            sd["scheduler"] = self.scheduler.state_dict()
        for k, v in self.extra_state.items():
            sd[f"extra.{k}"] = v
        for k, v in self.rank_state.items():
            sd[f"rank{self.rank}.{k}"] = v
        rng = self.frozen_rng if self.frozen_rng is not None else self._rng()
        sd[f"rank{self.rank}.rng"] = rng  # per-rank key: a shared key would be deduplicated
        return sd

    @staticmethod
    def _rng() -> dict[str, Any]:
        rng: dict[str, Any] = {
            "torch": torch.get_rng_state(),
            "python": _packed(_python_rng_state()),
            "numpy": _packed(_numpy_rng_state()),
        }
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state_all()
        return rng

    def apply(self, sd: dict[str, Any]) -> int:
        """Write a loaded state dict back into the training's objects; the step it holds."""
        set_state_dict(
            self.model,
            self.optimizer if self.optimizer is not None else [],
            model_state_dict=sd["model"],
            optim_state_dict=sd.get("optim", {}),
        )
        if self.scheduler is not None:
            self.scheduler.load_state_dict(sd["scheduler"])
        for k, v in self.extra_state.items():
            if not isinstance(v, Stateful):
                self.extra_state[k] = sd[f"extra.{k}"]
        for k, v in self.rank_state.items():
            if not isinstance(v, Stateful):
                self.rank_state[k] = sd[f"rank{self.rank}.{k}"]
        rng = sd[f"rank{self.rank}.rng"]
        torch.set_rng_state(rng["torch"])
        _set_python_rng_state(_unpacked(rng["python"]))
        _set_numpy_rng_state(_unpacked(rng["numpy"]))
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        return int(sd[STEP_KEY])

    def stable_storages(self) -> set[int]:
        """Storages that change only in ``optimizer.step()``: parameters and optimizer state."""
        ptrs = {p.untyped_storage().data_ptr() for p in self.model.parameters()}
        for state in self.optimizer.state.values() if self.optimizer is not None else ():
            ptrs.update(t.untyped_storage().data_ptr() for t in state.values() if isinstance(t, torch.Tensor))
        return ptrs


_RNG_BYTES = 16384  # fixed size: the load template must match the saved tensor's shape


def _python_rng_state() -> dict[str, Any]:
    version, internal, gauss = random.getstate()
    return {"version": version, "internal": list(internal), "gauss": gauss}


def _set_python_rng_state(state: dict[str, Any]) -> None:
    random.setstate((int(state["version"]), tuple(int(x) for x in state["internal"]), state["gauss"]))


def _numpy_rng_state() -> dict[str, Any]:
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "name": name,
        "keys": [int(k) for k in keys],
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached": float(cached),
    }


def _set_numpy_rng_state(state: dict[str, Any]) -> None:
    keys = np.array(state["keys"], dtype=np.uint32)
    np.random.set_state((str(state["name"]), keys, int(state["pos"]), int(state["has_gauss"]), float(state["cached"])))


def _packed(state: dict[str, Any]) -> torch.Tensor:
    """An RNG state as a fixed-size uint8 tensor (8-byte length, then JSON), so it is staged and
    saved like any tensor. JSON, not pickle: loading a checkpoint never runs code."""
    body = json.dumps(state, separators=(",", ":")).encode()
    if len(body) + 8 > _RNG_BYTES:
        raise CheckpointError(f"RNG state of {len(body)} bytes exceeds {_RNG_BYTES - 8}")
    buf = bytearray(_RNG_BYTES)
    buf[:8] = len(body).to_bytes(8, "little")
    buf[8 : 8 + len(body)] = body
    return torch.frombuffer(buf, dtype=torch.uint8)


def _unpacked(t: torch.Tensor) -> dict[str, Any]:
    raw = t.numpy().tobytes()
    n = int.from_bytes(raw[:8], "little")
    if not 0 < n <= len(raw) - 8:
        raise CorruptCheckpoint(f"RNG state length {n} is out of range")
    try:
        state = json.loads(raw[8 : 8 + n])
    except ValueError as exc:
        raise CorruptCheckpoint(f"RNG state is not valid JSON: {exc}") from None
    if not isinstance(state, dict):
        raise CorruptCheckpoint("RNG state is not a JSON object")
    return state
