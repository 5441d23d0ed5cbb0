"""The checkpoint's writer threads skip ``torch.save``'s CRC32 of every record (the file's xxh3
covers the same bytes, and the restore verifies it before loading): the records carry CRC 0, the
checkpoint still restores bit-exact and fails on one flipped bit, and the training's own
``torch.save`` keeps its CRC32 (torch's config patch is the writer thread's only)."""

from __future__ import annotations

import io
import struct
import zipfile
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from powerguard.ckpt_agent._hashing import HashingWriter
from powerguard.ckpt_agent._loading import VerifyingReader

CENTRAL_HEADER = b"PK\x01\x02"  # a record's central-directory entry (holds its final CRC32)


def _state() -> dict:
    g = torch.Generator().manual_seed(2)
    return {
        "w": torch.randn(256, 64, generator=g),
        "m": torch.randn(128, generator=g).to(torch.bfloat16),
        "n": torch.arange(50, dtype=torch.int32),
    }


def _records(data: bytes) -> list[tuple[str, int]]:
    """(name, CRC32) of every zip record ``torch.save`` wrote into a DCP data file (one archive
    per item, one after another)."""
    out, at = [], data.find(CENTRAL_HEADER)
    while at >= 0:
        crc, _, _, name_len = struct.unpack_from("<IIIH", data, at + 16)
        name = data[at + 46 : at + 46 + name_len]
        if name.startswith(b"archive/"):
            out.append((name.decode(), crc))
        at = data.find(CENTRAL_HEADER, at + 4)
    return out


def _save(directory: Path, threads: int = 2) -> dict:
    writer = HashingWriter(directory, sync_files=True, thread_count=threads)
    dcp.save(_state(), storage_writer=writer)
    return writer.data_files()


def test_the_records_carry_no_crc_and_restore_bit_exact(tmp_path):
    files = _save(tmp_path)
    records = [r for name in files for r in _records((tmp_path / name).read_bytes())]
    data = [crc for name, crc in records if "/data/" in name]
    assert len(data) == 3  # one tensor record per item
    assert data == [0, 0, 0]
    got = {k: torch.zeros_like(v) for k, v in _state().items()}
    dcp.load(got, storage_reader=VerifyingReader(tmp_path, files=files, key=None))
    for k, v in _state().items():
        assert got[k].dtype == v.dtype and torch.equal(got[k], v), k


def test_a_flipped_bit_in_a_record_without_crc_is_still_caught(tmp_path):
    files = _save(tmp_path, threads=1)
    (name,) = files
    path = tmp_path / name
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    path.write_bytes(bytes(raw))
    got = {k: torch.zeros_like(v) for k, v in _state().items()}
    with pytest.raises(CheckpointException, match=name):
        dcp.load(got, storage_reader=VerifyingReader(tmp_path, files=files, key=None))


def test_the_trainings_own_torch_save_keeps_its_crc(tmp_path):
    _save(tmp_path, threads=1)  # the writer ran on this (the calling) thread
    buf = io.BytesIO()
    torch.save(torch.randn(1000), buf)
    archive = zipfile.ZipFile(io.BytesIO(buf.getvalue()))
    assert archive.testzip() is None
    assert all(info.CRC != 0 for info in archive.infolist() if info.file_size)
