"""A restore reads every byte of a checkpoint once: the tensors it lands straight in their targets
leave the page cache as they land (a node's memory is not left full of a checkpoint no one reads
again), and the load stays bit-exact. Residency is the kernel's own count (util-linux ``fincore``,
``mincore(2)``)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
import torch
import torch.distributed.checkpoint as dcp

from powerguard.ckpt_agent._hashing import HashingWriter
from powerguard.ckpt_agent._loading import VerifyingReader


def _resident(path) -> int:
    """Bytes of the file in the page cache."""
    cmd = ["fincore", "--bytes", "--noheadings", "--output", "RES", str(path)]
    return int(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.split()[0])


def _lets_go(directory) -> bool:
    """Whether this file system drops clean pages on ``POSIX_FADV_DONTNEED`` (tmpfs keeps them)."""
    probe = directory / "probe"
    with open(probe, "wb") as f:
        f.write(os.urandom(1 << 20))
        f.flush()
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    gone = _resident(probe) == 0
    probe.unlink()
    return gone


def test_the_tensors_a_restore_lands_leave_the_page_cache(tmp_path):
    if shutil.which("fincore") is None:
        pytest.skip("no fincore (util-linux) to count the cached pages")
    if not _lets_go(tmp_path):
        pytest.skip(f"{tmp_path}: this file system keeps clean pages cached")
    g = torch.Generator().manual_seed(2)
    want = {
        "w": torch.randn(1024, 2048, generator=g),  # 8 MiB: more than one read chunk
        "m": torch.randn(512, 1024, generator=g).to(torch.bfloat16),
        "step": torch.tensor(7),
        "obj": {"lr": 0.1},  # bytes: DCP's own path, from the pages the restore's pass left cached
    }
    writer = HashingWriter(tmp_path, sync_files=True, thread_count=2)
    dcp.save(want, storage_writer=writer)
    files = writer.data_files()
    data = [tmp_path / name for name in files]
    total = sum(p.stat().st_size for p in data)
    for p in data:  # every page cached before the restore (the save leaves them so anyway)
        p.read_bytes()
    assert sum(_resident(p) for p in data) >= total * 0.9

    got = {k: torch.zeros_like(v) for k, v in want.items() if isinstance(v, torch.Tensor)}
    got["obj"] = {"lr": None}
    reader = VerifyingReader(tmp_path, files=files, key=None, threads=2)
    dcp.load(got, storage_reader=reader)

    for k, v in want.items():
        if isinstance(v, torch.Tensor):
            assert got[k].dtype == v.dtype and torch.equal(got[k], v), k
    assert got["obj"] == want["obj"]
    assert reader.direct == 3
    left = sum(_resident(p) for p in data)
    assert left < total * 0.05, f"{left} of {total} bytes still cached after the restore"
