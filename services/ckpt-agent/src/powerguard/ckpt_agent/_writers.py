"""How many parallel writers one rank's synchronous save uses (DCP's ``thread_count``).

Measured (docs/performance.md, ``bench/power_checkpoint.py``, alternated reps on this
project's virtual disk): one writer leaves the disk half idle while the kernel throttles the
single stream of dirty pages; several files per rank, each written and fsynced once by its own
thread, keep it busy, and the more at once the better up to 16 per rank: with 4 GB in one rank
16 writers took 5.6 s against 6.2 s with 4 or 8 (6 reps); with 1 GB, 16 per rank was plain
DCP's fastest setting at 1 and at 4 ranks per node (1.38 s against 1.45-1.62 s with 2, 4 or 8
at 4 ranks, 7 reps), with files of 16 MiB. So one writer per ``bytes_per_writer`` of the rank's
state, at least 4 and at most 16; no file is smaller than ``min_file_bytes``: a small state
gains nothing from splitting."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

RANK_WRITERS = 4  # writer threads (files) per rank, at least (and a node's reader threads)
MOST_RANK_WRITERS = 16
BYTES_PER_WRITER = 16 << 20
MIN_FILE_BYTES = 16 << 20


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
