"""On-disk layout of a checkpoint and its durability markers (any fsspec filesystem).

    <root>/<job>/step-<N>/
        __<r>_0.distcp ...      DCP data files, written by the ranks
        .metadata               DCP metadata (rank 0)
        MANIFEST.rank<r>.json   per rank: files it wrote, sizes, xxh3-128
        COMMIT                  rank 0, last: step, world size, manifest digests

A checkpoint counts only with a COMMIT whose manifests match the files.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec
import xxhash

from .errors import CorruptCheckpoint

COMMIT = "COMMIT"
FORMAT = 1
_STEP = re.compile(r"^step-(\d+)$")
_CHUNK = 8 * 1024 * 1024


def manifest_name(rank: int) -> str:
    return f"MANIFEST.rank{rank}.json"


def step_dir(root: str, job: str, step: int) -> str:
    return f"{root.rstrip('/')}/{job}/step-{step}"


def digest_bytes(data: bytes) -> str:
    return xxhash.xxh3_128_hexdigest(data)


def fs_for(url: str) -> tuple[fsspec.AbstractFileSystem, str]:
    fs, path = fsspec.core.url_to_fs(url)
    return fs, path


def is_local(fs: fsspec.AbstractFileSystem) -> bool:
    return "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,))


def fsync_dir(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durable(fs: fsspec.AbstractFileSystem, path: str, data: bytes) -> None:
    """temp file + fsync + rename (+ directory fsync on local disks)."""
    tmp = f"{path}.tmp"
    if is_local(fs):
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(os.path.dirname(path))
    else:
        with fs.open(tmp, "wb") as f:
            f.write(data)
        fs.mv(tmp, path)


def write_manifest(fs, directory: str, rank: int, step: int, files: dict[str, dict[str, Any]]) -> tuple[str, int]:
    """Write this rank's manifest durably; return (its digest, bytes of the files it lists)."""
    body = json.dumps({"format": FORMAT, "rank": rank, "step": step, "files": files}, sort_keys=True).encode()
    write_durable(fs, f"{directory}/{manifest_name(rank)}", body)
    return digest_bytes(body), sum(int(f["size"]) for f in files.values())


def write_commit(
    fs,
    directory: str,
    *,
    step: int,
    world_size: int,
    digests: dict[int, str],
    metadata_digest: str,
    extra: dict[str, Any] | None = None,
) -> None:
    body = {
        "format": FORMAT,
        "step": step,
        "world_size": world_size,
        "created": time.time(),
        "manifests": {str(r): d for r, d in sorted(digests.items())},
        "metadata_xxh3": metadata_digest,
        **(extra or {}),
    }
    write_durable(fs, f"{directory}/{COMMIT}", json.dumps(body, sort_keys=True).encode())
    if is_local(fs):
        fsync_dir(os.path.dirname(directory.rstrip("/")))


def hash_file(fs, path: str) -> tuple[int, str]:
    h = xxhash.xxh3_128()
    size = 0
    with fs.open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
    return size, h.hexdigest()


@dataclass(frozen=True)
class Committed:
    directory: str
    step: int
    world_size: int
    commit: dict[str, Any]


def list_steps(fs, root: str, job: str) -> list[tuple[int, str]]:
    """Step directories of a job, newest first (committed or not)."""
    base = f"{root.rstrip('/')}/{job}"
    try:
        entries = fs.ls(base, detail=False)
    except FileNotFoundError:
        return []
    out = []
    for e in entries:
        m = _STEP.match(e.rstrip("/").rsplit("/", 1)[-1])
        if m:
            out.append((int(m.group(1)), e.rstrip("/")))
    return sorted(out, reverse=True)


def read_commit(fs, directory: str) -> dict[str, Any]:
    try:
        with fs.open(f"{directory}/{COMMIT}", "rb") as f:
            return json.loads(f.read())
    except FileNotFoundError:
        raise CorruptCheckpoint(f"{directory}: no COMMIT (the save did not finish)") from None
    except ValueError as exc:
        raise CorruptCheckpoint(f"{directory}: COMMIT unreadable: {exc}") from None


def manifest_files(fs, directory: str, commit: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every data file listed by the manifests, after checking each manifest against COMMIT."""
    files: dict[str, dict[str, Any]] = {}
    for rank, want in commit["manifests"].items():
        path = f"{directory}/{manifest_name(int(rank))}"
        try:
            with fs.open(path, "rb") as f:
                body = f.read()
        except FileNotFoundError:
            raise CorruptCheckpoint(f"{directory}: manifest of rank {rank} missing") from None
        if digest_bytes(body) != want:
            raise CorruptCheckpoint(f"{directory}: manifest of rank {rank} does not match COMMIT")
        listed = json.loads(body)["files"]
        for name in listed:
            if not _confined(name):  # never a path outside the checkpoint (../../dev/zero hangs a restore)
                raise CorruptCheckpoint(f"{directory}: manifest of rank {rank} names {name!r}, outside the checkpoint")
        files.update(listed)
    return files


def _confined(name: object) -> bool:
    """A plain file name inside the checkpoint directory: no separators, no '..', no hidden tricks."""
    return (
        isinstance(name, str)
        and 0 < len(name) <= 255
        and "/" not in name
        and "\\" not in name
        and name not in (".", "..")
        and "\x00" not in name
    )


def verify_files(fs, directory: str, files: dict[str, dict[str, Any]], names: list[str]) -> None:
    """Check size and checksum of ``names``; raise :class:`CorruptCheckpoint` naming the file."""
    for name in names:
        want = files[name]
        try:
            size, digest = hash_file(fs, f"{directory}/{name}")
        except FileNotFoundError:
            raise CorruptCheckpoint(f"{directory}/{name}: missing") from None
        if size != want["size"]:
            raise CorruptCheckpoint(f"{directory}/{name}: {size} bytes, manifest says {want['size']}")
        if digest != want["xxh3"]:
            raise CorruptCheckpoint(f"{directory}/{name}: checksum mismatch (xxh3 {digest} != {want['xxh3']})")


def retain(fs, root: str, job: str, keep: int) -> list[str]:
    """Delete all but the newest ``keep`` committed checkpoints (and uncommitted ones older
    than the oldest kept). Returns the directories removed."""
    steps = list_steps(fs, root, job)
    committed = [d for _, d in steps if fs.exists(f"{d}/{COMMIT}")]
    if len(committed) <= keep:
        return []
    oldest_kept = committed[keep - 1]
    kept_step = int(_STEP.match(oldest_kept.rsplit("/", 1)[-1]).group(1))
    removed = []
    for step, d in steps:
        if step < kept_step:
            fs.rm(d, recursive=True)
            removed.append(d)
    return removed
