"""The restore's load, verified as it reads: each file the job loads is read once, in order, by
the one rank that loads most of its bytes (:func:`verifiers`, decided in DCP's global plan), and
every byte of it is hashed (xxh3-128, and the keyed digest with a site key) as it lands; a
tensor stored as its target's bytes lands straight in the target (``preadv``: one copy from the
disk's page cache, no tensor allocated, no second read), and the page cache lets go of those bytes
as soon as they are in the target (``POSIX_FADV_DONTNEED``, a chunk at a time): a restore reads
every byte once, and caching a whole checkpoint takes the node's memory for pages no one reads
again. On this project's virtual machine, whose free memory goes back to its host, a 1-rank 4 GB
restore took 1.9-3.5 s (median 2.6) caching everything and 1.4-2.0 s (median 1.6) letting go, in
7 alternated repetitions (``docs/performance.md``). A file whose digest does not match its
manifest entry raises :class:`CorruptCheckpoint` naming it, once it has been read; DCP hands the
failure to every rank (its all-gather of the reads), so the other ranks that loaded a few items
of that file (a replicated item DCP stored once, a reshard) read just those items and rely on
that verdict: every file is hashed once per job, not once per rank that touches it (4 ranks each
loading one step counter from every other rank's files hashed the whole checkpoint 4 times).
The restore then moves on to the next checkpoint (whose load writes every tensor again) or stops
(``Restorer``: a fresh start verifies first instead, so it never starts from a part-loaded
model). Files are read in parallel (``threads``), each by one thread.

A tensor item goes straight to its target when its stored bytes are the target's bytes: same
dtype, both contiguous, the range the item asks for contiguous in the stored tensor. The stored
tensor's layout is read from its ``torch.save`` archive loaded onto the ``meta`` device
(``weights_only``: no code runs, no data is read). Everything else (bytes, other layouts) takes
DCP's own path (``torch.load`` + ``copy_``), after its file checked out where this rank verifies
it, from the page cache the check filled; bytes through :class:`SafeLoadPlanner` (no code runs,
verified or not). Files no rank of this job loads (a reshard leaves some) are checked by size only;
COMMIT, the manifests and ``.metadata`` are checked before anything is loaded
(``Restorer._verify``)."""

from __future__ import annotations

import dataclasses
import io
import mmap
import os
import pickle
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from typing import Any, NamedTuple

import torch
import xxhash
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem

from . import _keys as K
from . import _layout as L
from ._metadata import SafeFileSystemReader, completed, each_file, items_by_file
from .errors import CorruptCheckpoint

_CHUNK = 8 << 20  # read and hashed at a time (hashed while still in the CPU's cache)
_PARSERS = 8  # tensor items whose layout is read at once (small reads: at the disk's latency)


class _Direct(NamedTuple):
    start: int  # the item's tensor bytes in the file: [start, end)
    end: int
    target: torch.Tensor
    req: ReadItem


class _File(NamedTuple):
    name: str
    fd: int
    items: list[ReadItem]  # in the file's order
    layouts: list[Future | None]  # each tensor item's _Direct (or None), being read


class _PreadView(io.RawIOBase):
    """A read-only window [offset, offset + length) of a file, read with ``pread`` (threads can
    share the descriptor: no shared file position)."""

    def __init__(self, fd: int, offset: int, length: int) -> None:
        self._fd, self._offset, self._length, self._pos = fd, offset, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._length}[whence]
        self._pos = max(0, base + pos)
        return self._pos

    def readinto(self, b: Any) -> int:
        mv = memoryview(b).cast("B")
        n = max(0, min(len(mv), self._length - self._pos))
        if n == 0:
            return 0
        got = os.preadv(self._fd, [mv[:n]], self._offset + self._pos)
        self._pos += got
        return got


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner whose bytes items (a state's non-tensor values: the optimizer's
    hyperparameters, the agent's step) are read with ``torch.load(weights_only=True)``: tensors
    and plain values only, no code. DCP's own reads them with ``weights_only=False`` (any pickle
    runs): a forged data file ran code wherever it was parsed before it was verified (a rank
    loading a replicated value from a file another rank verifies) and everywhere without a site
    key (a forger recomputes the checksums). Anything else is refused, named."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        try:
            obj = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as exc:
            reason = str(exc).strip().splitlines()
            raise CorruptCheckpoint(
                f"{read_item.dest_index.fqn}: not tensors and plain values, not loaded "
                f"({reason[-1] if reason else type(exc).__name__})"
            ) from None
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


class SafeEmptyLoadPlanner(_EmptyStateDictLoadPlanner):
    """DCP's planner that rebuilds a whole state dict from a checkpoint's metadata (what
    ``powerguard check-resume`` compares), its values read as :class:`SafeLoadPlanner` reads
    them: every DCP load the agent makes parses non-tensor values with ``weights_only=True``."""

    load_bytes = SafeLoadPlanner.load_bytes


@dataclasses.dataclass(frozen=True)
class Verify:
    """A rank's load plan's ``storage_data``: the files it hashes whole."""

    files: frozenset[str]


def verifiers(storage_data: dict[Any, Any], plans: list[LoadPlan]) -> list[frozenset[str]]:
    """The files each rank (``plans[rank]``) hashes whole: every file some rank loads, by the
    rank that loads most of its stored bytes (the lowest such rank on a tie)."""
    loads: dict[str, dict[int, int]] = {}
    for rank, plan in enumerate(plans):
        for item in plan.items:
            info = storage_data[item.storage_index]
            by_rank = loads.setdefault(info.relative_path, {})
            by_rank[rank] = by_rank.get(rank, 0) + info.length
    mine: list[set[str]] = [set() for _ in plans]
    for name, by_rank in loads.items():
        mine[min(by_rank, key=lambda r: (-by_rank[r], r))].add(name)
    return [frozenset(m) for m in mine]


class VerifyingReader(SafeFileSystemReader):
    """DCP's file system reader (metadata read without running code) that hashes every byte of
    each file it verifies against ``files`` (the manifests' entries) in the pass that loads it."""

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        files: dict[str, dict[str, Any]],
        key: bytes | None,
        threads: int = 1,
    ) -> None:
        super().__init__(path)
        self.files, self.key, self.threads = files, key, threads
        self.direct = 0  # tensor items read straight into their target (the rest: DCP's torch.load)
        self.hashed: list[str] = []  # the files this rank hashed whole (its last load)

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        plans = super().prepare_global_plan(plans)
        mine = verifiers(self.storage_data, plans)
        return [dataclasses.replace(p, storage_data=Verify(m)) for p, m in zip(plans, mine, strict=True)]

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> torch.futures.Future[None]:
        per_file = items_by_file(self.storage_data, plan)
        names = sorted(per_file)
        # without a global plan of this reader's (DCP's rank-local path): every file it loads
        whole = plan.storage_data.files if isinstance(plan.storage_data, Verify) else frozenset(names)
        self.hashed = []
        unlisted = [n for n in names if n not in self.files]
        if unlisted:
            raise CorruptCheckpoint(f"{self.path}/{unlisted[0]}: DCP's metadata names a file no manifest lists")
        with ExitStack() as open_files, ThreadPoolExecutor(_PARSERS, thread_name_prefix="pg-ckpt-parse") as parse:
            files: dict[str, _File] = {}
            for name in names:  # every item's layout read at once (small reads), while files load
                try:
                    f = open_files.enter_context(open(os.path.join(self.path, name), "rb", buffering=0))
                except FileNotFoundError:
                    raise CorruptCheckpoint(f"{self.path}/{name}: missing") from None
                items = sorted(per_file[name], key=lambda r: self.storage_data[r.storage_index].offset)
                layouts = [
                    parse.submit(self._direct, f.fileno(), r, planner) if r.type == LoadItemType.TENSOR else None
                    for r in items
                ]
                files[name] = _File(name, f.fileno(), items, layouts)
            each_file(names, lambda n: self._load_file(files[n], planner, n in whole), self.threads)
        return completed()

    def _load_file(self, file: _File, planner: LoadPlanner, whole: bool) -> None:
        where = f"{self.path}/{file.name}"
        size = os.fstat(file.fd).st_size
        want = self.files[file.name]
        if problem := L.size_problem(where, size, want):
            raise CorruptCheckpoint(problem)
        direct: list[_Direct] = []
        rest: list[ReadItem] = []
        for req, layout in zip(file.items, file.layouts, strict=True):
            got = layout.result() if layout is not None else None
            if got is not None and (not direct or got.start >= direct[-1].end) and got.end <= size:
                direct.append(got)
            else:
                rest.append(req)
        if whole:
            self.hashed.append(file.name)
            digest, keyed = self._read(file.fd, where, size, direct)
            if problem := L.digest_problem(where, size, digest, keyed, want, self.key):
                raise CorruptCheckpoint(problem)
        else:  # its verifier hashes it whole; a mismatch there fails this load on every rank
            for d in direct:
                _pread_into(file.fd, where, _bytes_of(d.target), d.start, drop=True)
        for d in direct:
            planner.commit_tensor(d.req, d.target)
        self.direct += len(direct)
        if rest:  # DCP's own reading of them (from the page cache, where this pass filled it)
            super().read_data(LoadPlan(rest), planner).wait()

    def _read(self, fd: int, where: str, size: int, direct: list[_Direct]) -> tuple[str, str | None]:
        """One pass over the file: the direct items' bytes into their targets, the rest into a
        scratch buffer (the largest gap between them, at most a chunk: the archives' headers,
        the items DCP reads itself, which stay in the page cache for it); every byte hashed.
        (xxh3, keyed digest or None)."""
        hasher = xxhash.xxh3_128()
        keyed = K.keyed_hasher(self.key) if self.key is not None else None
        ends = [d.start for d in direct] + [size]
        gaps = [end - start for start, end in zip([0] + [d.end for d in direct], ends, strict=True)]
        scratch = memoryview(bytearray(min(_CHUNK, max(gaps)) or 1))
        pos = 0
        hashers = (hasher,) if keyed is None else (hasher, keyed)

        def into(dst: memoryview, offset: int, *, drop: bool = False) -> None:
            _pread_into(fd, where, dst, offset, hashers, drop=drop)

        for d in direct:
            while pos < d.start:
                n = min(len(scratch), d.start - pos)
                into(scratch[:n], pos)
                pos += n
            if d.end > d.start:
                into(_bytes_of(d.target), d.start, drop=True)
            pos = d.end
        while pos < size:
            n = min(len(scratch), size - pos)
            into(scratch[:n], pos)
            pos += n
        return hasher.hexdigest(), keyed.hexdigest() if keyed is not None else None

    def _direct(self, fd: int, req: ReadItem, planner: LoadPlanner) -> _Direct | None:
        """Where a tensor item's bytes lie in the file when they are its target's bytes, else None."""
        info = self.storage_data[req.storage_index]
        if info.transform_descriptors:
            return None
        view = _PreadView(fd, info.offset, info.length)
        try:
            stored = torch.load(view, map_location="meta", weights_only=True)
            view.seek(0)
            archive = torch._C.PyTorchFileReader(view)
            records = [r for r in archive.get_all_records() if r.startswith("data/") or "/data/" in r]
            if len(records) != 1:
                return None
            record_offset = archive.get_record_offset(records[0])
            record_size = archive.get_record_size(records[0])
        except Exception:  # not a plain torch.save archive: DCP's own path says what is wrong
            return None
        finally:
            # the few pages read here leave the page cache, whole pages (this rank's load of the
            # file waits for every layout; another rank reading it meanwhile reads them again):
            # cached islands in the middle of a file cut the kernel's readahead of the load that
            # follows into 4 KiB pages
            _let_go_pages(fd, info.offset, info.length)
        if not isinstance(stored, torch.Tensor) or not stored.is_contiguous():
            return None
        first, count = _contiguous_range(stored, req.storage_offsets, req.lengths)
        if first is None:
            return None
        target = planner.resolve_tensor(req).detach()
        size = stored.element_size()
        start = info.offset + record_offset + (stored.storage_offset() + first) * size
        if (
            target.dtype != stored.dtype
            or target.device.type != "cpu"
            or not target.is_contiguous()
            or target.numel() != count
            or tuple(target.shape) != tuple(req.lengths)
            or (stored.storage_offset() + first + count) * size > record_size
            or record_offset + record_size > info.length
        ):
            return None
        return _Direct(start, start + count * size, target, req)


def _bytes_of(tensor: torch.Tensor) -> memoryview:
    """A contiguous CPU tensor's own bytes, writable in place (what a read fills)."""
    return memoryview(tensor.view(-1).view(torch.uint8).numpy())


def _pread_into(
    fd: int, where: str, dst: memoryview, offset: int, hashers: tuple[Any, ...] = (), *, drop: bool = False
) -> None:
    """Fill ``dst`` from the file at ``offset``, a chunk at a time, each chunk hashed by
    ``hashers`` while still in the CPU's cache; with ``drop``, each chunk's pages leave the page
    cache once read (``dst`` holds them now)."""
    done = 0
    while done < len(dst):
        got = os.preadv(fd, [dst[done : done + _CHUNK]], offset + done)
        if got <= 0:
            raise CorruptCheckpoint(f"{where}: ended at {offset + done} bytes while read")
        for h in hashers:
            h.update(dst[done : done + got])
        if drop:
            _let_go(fd, offset + done, got)
        done += got


def _let_go(fd: int, offset: int, length: int) -> None:
    """The page cache may drop these bytes of the file (read once, into their target)."""
    try:
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)
    except OSError:  # advice: a file system without it keeps its pages, which is only slower
        pass


def _let_go_pages(fd: int, offset: int, length: int) -> None:
    """:func:`_let_go` of every page that holds a byte of [offset, offset + length) (the kernel
    drops only the pages wholly inside the range it is given)."""
    first = offset - offset % mmap.PAGESIZE
    _let_go(fd, first, offset + length - first + mmap.PAGESIZE - 1)


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


def precheck_sizes(path: str, files: dict[str, dict[str, Any]]) -> None:
    """Every file the manifests list is there with its size (a cheap check of the whole checkpoint)."""
    for name, want in sorted(files.items()):
        try:
            size = os.stat(os.path.join(path, name)).st_size
        except FileNotFoundError:
            raise CorruptCheckpoint(f"{path}/{name}: missing") from None
        if problem := L.size_problem(f"{path}/{name}", size, want):
            raise CorruptCheckpoint(problem)
