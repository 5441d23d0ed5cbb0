"""The restore's load, verified file by file and pipelined: while file N is loaded into the
training's tensors, file N+1 is read and checked against its manifest entry.

One thread reads the files this rank loads in order, each in one sequential pass, and hashes them
(xxh3-128, and the keyed digest with a site key); the calling thread loads a file's items only
once that file checked out, from the page cache the check just filled. A file that fails raises
:class:`CorruptCheckpoint` naming it; DCP hands the failure to every rank and the restore moves on
to the next checkpoint (which loads every tensor again), or stops. Files no rank of this job loads
(a reshard leaves some) are checked by size only; COMMIT, the manifests and ``.metadata`` are
checked before anything is loaded (:meth:`Restorer._precheck`).

A tensor item whose stored bytes are the target's bytes (same dtype, both contiguous, the narrowed
range contiguous in the stored tensor) is read straight into the target with ``preadv``: one copy
from the page cache, no new tensor allocated. The stored tensor's layout comes from its
``torch.save`` archive loaded onto the ``meta`` device (``weights_only``: no code runs, no data is
read); anything else takes DCP's own path (``torch.load`` + ``copy_``)."""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch
from torch.distributed.checkpoint.filesystem import _create_file_view
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem

from . import _layout as L
from ._metadata import SafeFileSystemReader
from .errors import CorruptCheckpoint

_READ = 16 << 20


class VerifyingReader(SafeFileSystemReader):
    """DCP's file system reader (metadata read without running code) that checks each file
    in full against ``files`` (the manifests' entries) before any of its bytes reach a tensor."""

    def __init__(
        self, path: str | os.PathLike, *, fs: Any, files: dict[str, dict[str, Any]], key: bytes | None
    ) -> None:
        super().__init__(path)
        self.files, self.key, self._fs = files, key, fs
        self.direct = 0  # tensor items read straight into their target (the rest: DCP's torch.load)

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> torch.futures.Future[None]:
        per_file: dict[str, list[ReadItem]] = {}
        for item in plan.items:
            per_file.setdefault(self.storage_data[item.storage_index].relative_path, []).append(item)
        names = sorted(per_file)
        unlisted = [n for n in names if n not in self.files]
        if unlisted:
            raise CorruptCheckpoint(f"{self.path}/{unlisted[0]}: DCP's metadata names a file no manifest lists")
        with ThreadPoolExecutor(1, thread_name_prefix="pg-ckpt-verify") as pool:
            checks: list[Future] = [pool.submit(self._check, n) for n in names]
            try:
                for name, check in zip(names, checks, strict=True):
                    problem = check.result()
                    if problem:
                        raise CorruptCheckpoint(problem)
                    self._load_file(name, per_file[name], planner)
            finally:
                for check in checks:
                    check.cancel()
        fut: torch.futures.Future = torch.futures.Future()
        fut.set_result(None)
        return fut

    def _check(self, name: str) -> str | None:
        return L.file_problem(self._fs, str(self.path), name, self.files[name], self.key)

    def _load_file(self, name: str, items: list[ReadItem], planner: LoadPlanner) -> None:
        path = os.path.join(self.path, name)
        rest: list[ReadItem] = []
        with open(path, "rb", buffering=0) as f:
            for req in sorted(items, key=lambda r: self.storage_data[r.storage_index].offset):
                if req.type == LoadItemType.TENSOR and self._direct(f, req, planner):
                    self.direct += 1
                else:
                    rest.append(req)
        if rest:  # DCP's own reading of them (bytes, and tensors stored another way)
            super().read_data(LoadPlan(rest), planner).wait()

    def _direct(self, f: Any, req: ReadItem, planner: LoadPlanner) -> bool:
        """Read one tensor item straight into its target; False: it needs DCP's path."""
        info = self.storage_data[req.storage_index]
        if info.transform_descriptors:
            return False
        view = _create_file_view(f, info.offset, info.length)
        try:
            stored = torch.load(view, map_location="meta", weights_only=True)
            view.seek(0)
            archive = torch._C.PyTorchFileReader(view)
            records = [r for r in archive.get_all_records() if r.startswith("data/") or "/data/" in r]
            if len(records) != 1:
                return False
            record_offset = archive.get_record_offset(records[0])
            record_size = archive.get_record_size(records[0])
        except Exception:  # not a plain torch.save archive: DCP's own path says what is wrong
            return False
        if not isinstance(stored, torch.Tensor) or not stored.is_contiguous():
            return False
        start, count = _contiguous_range(stored, req.storage_offsets, req.lengths)
        if start is None:
            return False
        target = planner.resolve_tensor(req).detach()
        size = stored.element_size()
        if (
            target.dtype != stored.dtype
            or target.device.type != "cpu"
            or not target.is_contiguous()
            or target.numel() != count
            or tuple(target.shape) != tuple(req.lengths)
            or (stored.storage_offset() + start + count) * size > record_size
            or record_offset + record_size > info.length
        ):
            return False
        if count:
            dst = memoryview(target.view(-1).view(torch.uint8).numpy())
            _pread_exactly(f.fileno(), dst, info.offset + record_offset + (stored.storage_offset() + start) * size)
        planner.commit_tensor(req, target)
        return True


def _contiguous_range(stored: torch.Tensor, offsets: Any, lengths: Any) -> tuple[int | None, int]:
    """(first element, element count) of ``stored`` narrowed by ``offsets``/``lengths`` when that
    range is one contiguous run of the (contiguous) stored tensor, else (None, 0)."""
    shape = tuple(stored.shape)
    offsets, lengths = tuple(offsets), tuple(lengths)
    if len(offsets) != len(shape) or len(lengths) != len(shape):
        return None, 0
    if not shape:  # a scalar
        return 0, 1
    for o, n, s in zip(offsets, lengths, shape, strict=True):
        if o < 0 or n < 0 or o + n > s:
            return None, 0
    # the leading dimension may be narrowed; every later one must be whole
    if any(o != 0 or n != s for o, n, s in zip(offsets[1:], lengths[1:], shape[1:], strict=True)):
        return None, 0
    row = 1
    for s in shape[1:]:
        row *= s
    return offsets[0] * row, lengths[0] * row


def _pread_exactly(fd: int, dst: memoryview, offset: int) -> None:
    done = 0
    while done < len(dst):
        got = os.preadv(fd, [dst[done : done + _READ]], offset + done)
        if got <= 0:
            raise CorruptCheckpoint(f"file ended {len(dst) - done} bytes early")
        done += got


def precheck_sizes(path: str, files: dict[str, dict[str, Any]]) -> None:
    """Every file the manifests list is there with its size (a cheap check of the whole checkpoint)."""
    for name, want in sorted(files.items()):
        try:
            size = os.stat(os.path.join(path, name)).st_size
        except FileNotFoundError:
            raise CorruptCheckpoint(f"{path}/{name}: missing") from None
        if size != want["size"]:
            raise CorruptCheckpoint(f"{path}/{name}: {size} bytes, manifest says {want['size']}")
