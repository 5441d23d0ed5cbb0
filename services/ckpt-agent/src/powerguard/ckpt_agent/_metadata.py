"""DCP's ``.metadata`` read without running code, with or without a site key.

DCP writes ``.metadata`` with ``pickle`` and its readers load it with ``pickle.load``: whoever can
write a checkpoint tier could make a restore run code. Without a site key the COMMIT's checksums
only catch corruption (a forger recomputes them), so the restore reads ``.metadata`` through an
unpickler that admits only what DCP's metadata is made of: the dataclasses and enums of
``torch.distributed.checkpoint.metadata``, the file system writer's ``_StorageInfo``, ``torch.Size``,
torch's dtypes, layouts and memory formats, and paths. Anything else is refused with its name
(:class:`ForgedMetadata`) and the restore moves on to the next checkpoint.
"""

from __future__ import annotations

import dataclasses
import enum
import io
import os
import pickle
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner, ReadItem

from .errors import CorruptCheckpoint

METADATA = ".metadata"


class ForgedMetadata(CorruptCheckpoint):
    """``.metadata`` names something DCP's metadata never holds: it is not read."""


_ALLOWED: dict[tuple[str, str], Any] = {
    ("torch", "Size"): torch.Size,
    ("torch.serialization", "_get_layout"): torch.serialization._get_layout,  # by name: returns a layout
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"): dcp.filesystem._StorageInfo,
    ("pathlib", "PosixPath"): __import__("pathlib").PosixPath,
    ("pathlib", "PurePosixPath"): __import__("pathlib").PurePosixPath,
}


def _enum_member(cls: Any, name: str) -> Any:
    """What ``getattr`` may do in a metadata pickle: some Pythons (Debian's 3.11.2) pickle an enum
    member as ``getattr(EnumClass, "NAME")``; only a member of an admitted enum is returned."""
    if isinstance(cls, type) and issubclass(cls, enum.Enum) and _admitted(cls.__module__, cls.__qualname__) is cls:
        try:
            return cls[name]
        except KeyError:
            pass
    raise ForgedMetadata(f"{METADATA} asks getattr({cls!r}, {name!r}), not a member of DCP's metadata enums")


def _admitted(module: str, name: str) -> Any:
    if (module, name) == ("builtins", "getattr"):
        return _enum_member
    known = _ALLOWED.get((module, name))
    if known is not None:
        return known
    if module == "torch":
        obj = getattr(torch, name, None)
        if isinstance(obj, torch.dtype | torch.layout | torch.memory_format):
            return obj
    if module == dcp_metadata.__name__:
        obj = getattr(dcp_metadata, name, None)
        if isinstance(obj, type) and (dataclasses.is_dataclass(obj) or issubclass(obj, enum.Enum)):
            return obj
    return None


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        obj = _admitted(module, name)
        if obj is None:
            raise ForgedMetadata(f"{METADATA} refers to {module}.{name}, which DCP's metadata never holds")
        return obj


def load_metadata(data: bytes, where: str = METADATA) -> dcp_metadata.Metadata:
    """DCP's metadata from the bytes of a ``.metadata`` file; no code runs, whatever they hold."""
    try:
        meta = _Unpickler(io.BytesIO(data)).load()
    except ForgedMetadata as exc:
        raise ForgedMetadata(f"{where}: {exc}") from None
    except Exception as exc:  # truncated, not a pickle, a constructor refusing its arguments
        raise CorruptCheckpoint(f"{where}: unreadable ({type(exc).__name__}: {exc})") from None
    if not isinstance(meta, dcp_metadata.Metadata):
        raise ForgedMetadata(f"{where}: holds a {type(meta).__name__}, not DCP's Metadata")
    return meta


def check_metadata(fs, directory: str) -> None:
    """Raise :class:`ForgedMetadata` (or :class:`CorruptCheckpoint`) unless the directory's
    ``.metadata`` is DCP's metadata and nothing else (read without running code)."""
    where = f"{directory}/{METADATA}"
    with fs.open(where, "rb") as f:
        load_metadata(f.read(), where)


def _read(reader: dcp.FileSystemReader, kwargs: dict[str, Any]) -> dcp_metadata.Metadata:
    path = reader._get_metadata_path(kwargs.get("rank"))
    with reader.fs.create_stream(path, "rb") as f:
        meta = load_metadata(f.read(), str(path))
    if getattr(meta, "storage_meta", None) is None:
        meta.storage_meta = dcp_metadata.StorageMeta()
    meta.storage_meta.load_id = reader.load_id
    return meta


class SafeFileSystemReader(dcp.FileSystemReader):
    """DCP's file system reader whose metadata load runs no code (the data files are tensors
    and bytes DCP reads itself; the agent's own state is JSON). With ``threads`` > 1 the files
    are read in parallel, each by one thread as DCP reads it (its items in order)."""

    def __init__(self, path: str | os.PathLike, *, threads: int = 1) -> None:
        super().__init__(path)
        self.threads = threads

    def read_metadata(self, *args: Any, **kwargs: Any) -> dcp_metadata.Metadata:
        return _read(self, kwargs)

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> torch.futures.Future[None]:
        per_file = items_by_file(self.storage_data, plan)
        if self.threads <= 1 or len(per_file) <= 1:
            return super().read_data(plan, planner)
        read_one = super().read_data  # one file's items: DCP's own reading of them
        each_file(list(per_file), lambda n: read_one(replace(plan, items=per_file[n]), planner).wait(), self.threads)
        return completed()


def items_by_file(storage_data: dict[Any, Any], plan: LoadPlan) -> dict[str, list[ReadItem]]:
    """A load plan's items by the file that holds them (DCP's storage data names it)."""
    per_file: dict[str, list[ReadItem]] = {}
    for item in plan.items:
        per_file.setdefault(storage_data[item.storage_index].relative_path, []).append(item)
    return per_file


def each_file(names: list[str], work: Callable[[str], Any], threads: int) -> None:
    """``work(name)`` for every file, ``threads`` files at once, each by one thread. With
    threads, every file finishes (none is still writing into the state) before the first
    failure is raised; without, the first failure stops the rest."""
    if threads <= 1 or len(names) <= 1:
        for name in names:
            work(name)
        return
    with ThreadPoolExecutor(min(threads, len(names)), thread_name_prefix="pg-ckpt-load") as pool:
        done = [pool.submit(work, name) for name in names]
        problems = [d.exception() for d in done]
    for problem in problems:
        if problem is not None:
            raise problem


def completed() -> torch.futures.Future[None]:
    """A future already done: what ``read_data`` returns once every file has been read."""
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(None)
    return fut


class SafeFsspecReader(FsspecReader):
    """The same for the remote tier (fsspec)."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> dcp_metadata.Metadata:
        return _read(self, kwargs)
