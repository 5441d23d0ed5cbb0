"""How many parallel writers one rank's synchronous save uses (DCP's ``thread_count``).

Measured (docs/performance.md, ``bench/power_checkpoint.py``): one writer leaves the disk half
idle while the kernel throttles the single stream of dirty pages; a few files written by
parallel threads, each fsynced once by its thread, keep it busy. Past a handful per node,
more threads only contend. So: a budget of writer threads per node, shared by the node's
ranks, and no file smaller than ``min_file_bytes`` (a small state gains nothing from
splitting)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

NODE_WRITERS = 4  # writer threads per node, shared by its ranks
MIN_FILE_BYTES = 64 << 20


def writer_threads(
    rank_bytes: int, *, local_ranks: int, node_writers: int = NODE_WRITERS, min_file_bytes: int = MIN_FILE_BYTES
) -> int:
    """DCP ``thread_count`` for a rank that writes ``rank_bytes``, ``local_ranks`` ranks per node."""
    share = max(1, node_writers // max(1, local_ranks))
    return max(1, min(share, rank_bytes // max(1, min_file_bytes)))


def local_bytes(state: Any) -> int:
    """Bytes of the tensors in a state dict as this rank holds them (a DTensor's local shard)."""
    return sum(_bytes(t) for t in _tensors(state))


def _tensors(obj: Any) -> Iterable[Any]:
    if isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, list | tuple):
        for v in obj:
            yield from _tensors(v)
    elif isinstance(obj, torch.Tensor):
        yield obj


def _bytes(t: torch.Tensor) -> int:
    local = t.to_local() if hasattr(t, "to_local") else t
    return local.numel() * local.element_size()
