"""How many parallel writers one rank's synchronous save uses (DCP's ``thread_count``).

Measured (docs/performance.md, ``bench/power_checkpoint.py``, 1 GB of state): one writer leaves
the disk half idle while the kernel throttles the single stream of dirty pages; a few files per
rank, each written and fsynced once by its own thread, keep it busy: 4 per rank was the best
setting of plain DCP at 1 and at 4 ranks per node with 1 GB per rank (8 per rank and a budget of
4 per node shared by the ranks were slower), 8 with 4 GB in one rank (in two runs). So one
writer per ``bytes_per_writer`` of the rank's state, at least 4 and at most 8; no file is
smaller than ``min_file_bytes``: a small state gains nothing from splitting."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

RANK_WRITERS = 4  # writer threads (files) per rank, at least (and a node's reader threads)
MOST_RANK_WRITERS = 8
BYTES_PER_WRITER = 512 << 20
MIN_FILE_BYTES = 64 << 20


def writer_threads(
    rank_bytes: int,
    *,
    least: int = RANK_WRITERS,
    most: int = MOST_RANK_WRITERS,
    bytes_per_writer: int = BYTES_PER_WRITER,
    min_file_bytes: int = MIN_FILE_BYTES,
) -> int:
    """DCP ``thread_count`` for a rank that writes ``rank_bytes``."""
    wanted = min(most, max(least, rank_bytes // max(1, bytes_per_writer)))
    return max(1, min(wanted, rank_bytes // max(1, min_file_bytes)))


def reader_threads(local_ranks: int, *, node_streams: int = RANK_WRITERS) -> int:
    """Files one rank reads at once in a restore: the node's ``node_streams`` shared by the ranks
    on it (``LOCAL_WORLD_SIZE``). Measured (``bench/power_checkpoint.py``): 4 ranks on a node
    reading 4 files each at once were slower than 1 each (the same disk, the same cores)."""
    return max(1, node_streams // max(1, local_ranks))


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
