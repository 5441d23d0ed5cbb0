"""Staging for periodic (async) saves: copy the state into CPU buffers that are allocated once
and reused, so a save costs one memcpy of the state (no page faults on fresh memory). Pinned
memory when a GPU is present (faster device-to-host copies). Only one async save is in flight at
a time, so reusing the buffers is safe.

With ``stable`` (the storage pointers of the parameters and optimizer state, which change only
in ``optimizer.step()``), the copy overlaps with training: everything else (buffers such as
BatchNorm statistics, RNG states, counters) is copied at once, the stable tensors in a
background thread, and ``stage`` returns a Future. The agent makes the next ``optimizer.step()``
wait for that Future, so the snapshot is exactly the state at the checkpoint's step."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch
from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict
from torch.distributed.checkpoint.staging import AsyncStager, BlockingAsyncStager


class ReusingStager(AsyncStager):
    _synchronize_after_execute = False

    def __init__(self, *, stable: Callable[[], set[int]] | None = None) -> None:
        self._cache: dict[str, Any] | None = None
        self._keys: tuple | None = None
        self._stable = stable
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="pg-ckpt-stage") if stable else None
        self.staging: Future | None = None  # the background copy in flight, if any

    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any] | Future:
        keys = _shape_key(state_dict)
        try:
            if self._cache is None or keys != self._keys:
                self._cache = _create_cpu_state_dict(state_dict, pin_memory=torch.cuda.is_available())
                self._keys = keys
            if self._pool is None or self._stable is None:
                return _copy_state_dict(state_dict, self._cache)
            later: list[tuple[torch.Tensor, torch.Tensor]] = []
            staged = _assign(state_dict, self._cache, self._stable(), later)
            self.staging = self._pool.submit(_copy_pairs, later, staged)
            return self.staging
        except (ValueError, TypeError, KeyError):  # a layout torch's helpers do not handle: a fresh copy
            self._cache = None
            return BlockingAsyncStager().stage(state_dict)

    def wait_staged(self) -> None:
        """Block until the background copy (if any) has finished."""
        staging = self.staging
        if staging is not None:
            staging.result()

    def synchronize_staging(self) -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    def close(self) -> None:
        self._cache = None
        if self._pool is not None:
            self._pool.shutdown(wait=True)


def _assign(src: Any, dst: Any, stable: set[int], later: list[tuple[torch.Tensor, torch.Tensor]]) -> Any:
    """The staged structure: volatile tensors copied now, stable ones queued in ``later``."""
    if isinstance(src, dict):
        return {k: _assign(v, dst[k], stable, later) for k, v in src.items()}
    if isinstance(src, list | tuple):
        return type(src)(_assign(v, d, stable, later) for v, d in zip(src, dst, strict=True))
    if isinstance(src, torch.Tensor) and isinstance(dst, torch.Tensor):
        if src.untyped_storage().data_ptr() in stable:
            later.append((dst, src))
        else:
            dst.copy_(src)
        return dst
    return src  # ints, floats, bytes...: immutable snapshots already


def _copy_pairs(pairs: list[tuple[torch.Tensor, torch.Tensor]], staged: dict[str, Any]) -> dict[str, Any]:
    for dst, src in pairs:
        dst.copy_(src)  # releases the GIL: training goes on meanwhile
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return staged


def _shape_key(obj: Any) -> tuple:
    """What must match for the cached buffers to be reused (keys, shapes, dtypes)."""
    if isinstance(obj, dict):
        return tuple((k, _shape_key(v)) for k, v in obj.items())
    if isinstance(obj, list | tuple):
        return tuple(_shape_key(v) for v in obj)
    if isinstance(obj, torch.Tensor):
        return (tuple(obj.shape), obj.dtype)
    return (type(obj).__name__,)


def partition_replicated(
    state_dict: dict[str, Any], *, rank: int, world_size: int, keys: tuple[str, ...] = ("model", "optim")
) -> dict[str, Any]:
    """Keep, of the replicated tensors under ``keys`` (plain tensors, as DDP has them), only
    those this rank writes: the tensors are spread over the ranks by size, the same way on every
    rank. DCP then needs no de-duplication and each rank stages only its share. Sharded tensors
    (DTensor) and everything else stay."""
    if world_size <= 1:
        return state_dict
    leaves: list[tuple[tuple, int]] = []

    def walk(obj: Any, path: tuple) -> None:
        if isinstance(obj, dict):
            for k, v in obj.items():
                walk(v, (*path, k))
        elif type(obj) is torch.Tensor:
            leaves.append((path, obj.numel() * obj.element_size()))

    for k in keys:
        if k in state_dict:
            walk(state_dict[k], (k,))
    load = [0] * world_size
    mine: set[tuple] = set()
    for path, size in sorted(leaves, key=lambda item: (-item[1], repr(item[0]))):
        owner = min(range(world_size), key=lambda r: (load[r], r))
        load[owner] += size
        if owner == rank:
            mine.add(path)
    drop = {p for p, _ in leaves} - mine

    def prune(obj: Any, path: tuple) -> Any:
        if isinstance(obj, dict):
            return {k: prune(v, (*path, k)) for k, v in obj.items() if (*path, k) not in drop}
        return obj

    return {k: prune(v, (k,)) if k in keys else v for k, v in state_dict.items()}
