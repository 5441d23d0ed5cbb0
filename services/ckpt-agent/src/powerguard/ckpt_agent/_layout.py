"""On-disk layout of a checkpoint and its durability markers (any fsspec filesystem).

    <root>/<job>/step-<N>/
        __<r>_0.distcp ...      DCP data files, written by the ranks
        .metadata               DCP metadata (rank 0)
        MANIFEST.rank<r>.json   per rank: files it wrote, sizes, xxh3-128
        COMMIT                  rank 0, last: job, step, tier, world size, manifest digests

A checkpoint counts only with a COMMIT whose manifests match the files. xxh3 finds corruption,
not forgery: whoever can write a tier can rewrite a file and every checksum after it. With a
key (``POWERGUARD_CKPT_KEY_FILE``) every file, manifest and the DCP metadata also carry a
keyed BLAKE2b-256 digest and COMMIT a MAC over itself; a restore with the key refuses a
checkpoint the key did not sign before it reads a byte of its contents.

COMMIT names the job, the step and the tier it was written for (format 2): a restore refuses by
name a checkpoint of another job, one stored under another step's name (moved, copied) and one
written for another tier (:func:`check_binding`), with or without a key; with a key the names
are under the MAC. The key that signs is the job's own: a job key file (``powerguard ckpt-key
issue --job J``) is used as it is, the site key is derived per job (:func:`job_key`), so a job's
container given only its own key cannot sign for another job. A format-1 COMMIT (before the
binding) names no job: it is checked with the site key itself, and by its step.
"""

from __future__ import annotations

import hmac
import json
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec
import xxhash

from ._keys import KEYED, keyed_digest, keyed_hasher
from .errors import CorruptCheckpoint

COMMIT = "COMMIT"
FORMAT = 2  # 2: COMMIT names its job and tier (1: step and world size only)
TIERS = ("local", "node", "remote")  # the shared local tier, the node-local tier, the remote tier
_STEP = re.compile(r"^step-(\d+)$")
_CHUNK = 8 * 1024 * 1024


def manifest_name(rank: int) -> str:
    return f"MANIFEST.rank{rank}.json"


def step_dir(root: str, job: str, step: int) -> str:
    return f"{root.rstrip('/')}/{job}/step-{step}"


def digest_bytes(data: bytes) -> str:
    return xxhash.xxh3_128_hexdigest(data)


def _mac(key: bytes, commit: dict[str, Any]) -> str:
    body = json.dumps({k: v for k, v in commit.items() if k != "mac"}, sort_keys=True).encode()
    return keyed_digest(key, body)


def check_binding(commit: dict[str, Any], *, job: str | None, step: int | None, tier: str | None, where: str) -> None:
    """Refuse by name a COMMIT written for another job, stored under another step's name, or
    written for another tier (None: not checked). A format-1 COMMIT names no job or tier: its step
    is still checked."""
    bound = int(commit.get("format", 1)) >= 2
    if bound and job is not None and commit.get("job") != job:
        raise CorruptCheckpoint(f"{where}: job {commit.get('job')!r}'s checkpoint, not job {job!r}'s (moved or copied)")
    if step is not None and commit.get("step") != step:
        raise CorruptCheckpoint(
            f"{where}: holds step {commit.get('step')}, stored as step {step} (moved or copied from another step)"
        )
    if bound and tier is not None and commit.get("tier") != tier:
        raise CorruptCheckpoint(f"{where}: written for the {commit.get('tier')} tier, found in the {tier} tier")


def commit_id(commit: dict[str, Any]) -> str:
    """What identifies a checkpoint's contents, the same on every node and tier that holds it
    (its job, step, world size and every rank's manifest digest, which cover every data file;
    not when or where COMMIT was written): the acks name it, and a restore of the step the
    coordinator recorded takes the copy the acks named. Every rank computes it from what the
    save gathered (:func:`contents_id`)."""
    return contents_id(commit.get("job"), commit.get("step"), commit.get("world_size"), commit.get("manifests") or {})


def contents_id(job: Any, step: Any, world_size: Any, manifests: dict[str, str]) -> str:
    body = {"job": job, "step": step, "world_size": world_size, "manifests": dict(sorted(manifests.items()))}
    return digest_bytes(json.dumps(body, sort_keys=True).encode())


def authenticate(commit: dict[str, Any], key: bytes | None, where: str) -> None:
    """With a key: COMMIT must carry a valid MAC (checked before anything else is read)."""
    if key is None:
        return
    mac = commit.get("mac")
    if not isinstance(mac, str) or not isinstance(commit.get("keyed"), dict):
        raise CorruptCheckpoint(f"{where}: not signed with a checkpoint key (written without one)")
    if not hmac.compare_digest(mac, _mac(key, commit)):
        raise CorruptCheckpoint(
            f"{where}: COMMIT signature does not match the job's key (tampered, another job's, or another key)"
        )


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


def makedirs_durable(path: str | Path) -> None:
    """``mkdir -p`` whose directories survive a power cut: each one made is fsynced into its
    parent (a new directory's name is durable only then; a checkpoint committed inside a
    directory whose own name was lost is lost with it)."""
    missing = []
    p = os.path.abspath(path)
    while not os.path.isdir(p):
        missing.append(p)
        p = os.path.dirname(p)
    for d in reversed(missing):
        try:
            os.mkdir(d)
        except FileExistsError:
            pass
        fsync_dir(os.path.dirname(d))


def fsync_ancestors(path: str | Path) -> None:
    """fsync every directory above ``path`` (up to ``/``): a directory someone else made (a
    framework's output directory) is durable by name only once its parent was fsynced."""
    p = os.path.dirname(os.path.abspath(path))
    while True:
        fsync_dir(p)
        parent = os.path.dirname(p)
        if parent == p:
            return
        p = parent


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


def write_manifest(
    fs, directory: str, rank: int, step: int, files: dict[str, dict[str, Any]], key: bytes | None = None
) -> tuple[str, int, str | None]:
    """Write this rank's manifest durably; return (its digest, bytes of the files it lists,
    its keyed digest or None)."""
    body = json.dumps({"format": FORMAT, "rank": rank, "step": step, "files": files}, sort_keys=True).encode()
    write_durable(fs, f"{directory}/{manifest_name(rank)}", body)
    keyed = keyed_digest(key, body) if key is not None else None
    return digest_bytes(body), sum(int(f["size"]) for f in files.values()), keyed


def write_commit(
    fs,
    directory: str,
    *,
    job: str,
    tier: str,
    step: int,
    world_size: int,
    digests: dict[int, str],
    metadata_digest: str,
    extra: dict[str, Any] | None = None,
    key: bytes | None = None,
    keyed_manifests: dict[int, str] | None = None,
    metadata: bytes | None = None,
) -> dict[str, Any]:
    """Write COMMIT durably (last, over every manifest and the metadata); returns it."""
    if tier not in TIERS:
        raise ValueError(f"tier must be one of {', '.join(TIERS)}")
    body = {
        "format": FORMAT,
        "job": job,
        "tier": tier,
        "step": step,
        "world_size": world_size,
        "created": time.time(),
        "manifests": {str(r): d for r, d in sorted(digests.items())},
        "metadata_xxh3": metadata_digest,
        **(extra or {}),
    }
    if key is not None:
        if keyed_manifests is None or metadata is None:
            raise ValueError("a keyed COMMIT needs every manifest's keyed digest and the metadata")
        body["keyed"] = {
            "alg": KEYED,
            "manifests": {str(r): d for r, d in sorted(keyed_manifests.items())},
            "metadata": keyed_digest(key, metadata),
        }
        body["mac"] = _mac(key, body)
    write_durable(fs, f"{directory}/{COMMIT}", json.dumps(body, sort_keys=True).encode())
    if is_local(fs):
        fsync_dir(os.path.dirname(directory.rstrip("/")))
    return body


def rebound(commit: dict[str, Any], *, tier: str, key: bytes | None) -> bytes:
    """A COMMIT for a copy of the checkpoint in another tier (the remote copy): the same contents,
    its tier named and, with a key, signed again. A format-1 COMMIT is copied as it is."""
    if int(commit.get("format", 1)) < 2:
        return json.dumps(commit, sort_keys=True).encode()
    body = {k: v for k, v in commit.items() if k != "mac"}
    body["tier"] = tier
    if key is not None and "keyed" in body:
        body["mac"] = _mac(key, body)
    return json.dumps(body, sort_keys=True).encode()


def hash_file(fs, path: str, key: bytes | None = None) -> tuple[int, str, str | None]:
    """(size, xxh3, keyed digest or None) of a file, in one read."""
    h = xxhash.xxh3_128()
    k = keyed_hasher(key) if key is not None else None
    size = 0
    with fs.open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            if k is not None:
                k.update(chunk)
            size += len(chunk)
    return size, h.hexdigest(), k.hexdigest() if k is not None else None


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


def manifest_files(fs, directory: str, commit: dict[str, Any], key: bytes | None = None) -> dict[str, dict[str, Any]]:
    """Every data file listed by the manifests, after checking each manifest against COMMIT
    (and, with a key, against its keyed digest in the authenticated COMMIT)."""
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
        if key is not None and not hmac.compare_digest(
            str(commit["keyed"]["manifests"].get(rank, "")), keyed_digest(key, body)
        ):
            raise CorruptCheckpoint(f"{directory}: manifest of rank {rank} does not match its keyed digest")
        listed = json.loads(body)["files"]
        for name in listed:
            if not _confined(name):  # never a path outside the checkpoint (../../dev/zero hangs a restore)
                raise CorruptCheckpoint(f"{directory}: manifest of rank {rank} names {name!r}, outside the checkpoint")
        files.update(listed)
    return files


def checkpoint_files(fs, directory: str, commit: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """What a committed checkpoint is, by name: the data files its manifests list, the manifests
    and DCP's ``.metadata``, each with its size and xxh3 from the manifests and COMMIT. A copy
    to another tier copies exactly these: never what else the directory holds at the moment (a
    replica still arriving as ``*.recv``, a file of another writer)."""
    files = manifest_files(fs, directory, commit)
    for rank, digest in commit["manifests"].items():
        name = manifest_name(int(rank))
        files[name] = {"size": fs.size(f"{directory}/{name}"), "xxh3": digest}
    files[".metadata"] = {"size": fs.size(f"{directory}/.metadata"), "xxh3": commit["metadata_xxh3"]}
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


def verify_files(
    fs,
    directory: str,
    files: dict[str, dict[str, Any]],
    names: list[str],
    key: bytes | None = None,
    *,
    threads: int = 1,
) -> None:
    """Check size and checksum (and keyed digest) of ``names``; raise
    :class:`CorruptCheckpoint` naming the file (the first of ``names`` that is bad). With
    ``threads`` > 1 several files are read at once (a disk reads faster with a few streams)."""
    if threads > 1 and len(names) > 1:
        with ThreadPoolExecutor(min(threads, len(names)), thread_name_prefix="pg-ckpt-verify") as pool:
            problems = list(pool.map(lambda n: file_problem(fs, directory, n, files[n], key), names))
    else:
        problems = []
        for name in names:  # one at a time: stop at the first bad one
            problems.append(file_problem(fs, directory, name, files[name], key))
            if problems[-1]:
                break
    for problem in problems:
        if problem:
            raise CorruptCheckpoint(problem)


def file_problem(fs, directory: str, name: str, want: dict[str, Any], key: bytes | None) -> str | None:
    """What is wrong with one file of a checkpoint, or None."""
    try:
        size, digest, keyed = hash_file(fs, f"{directory}/{name}", key)
    except FileNotFoundError:
        return f"{directory}/{name}: missing"
    return digest_problem(f"{directory}/{name}", size, digest, keyed, want, key)


def size_problem(where: str, size: int, want: dict[str, Any]) -> str | None:
    """What a file's size says against its manifest entry, or None."""
    return f"{where}: {size} bytes, manifest says {want['size']}" if size != want["size"] else None


def digest_problem(
    where: str, size: int, digest: str, keyed: str | None, want: dict[str, Any], key: bytes | None
) -> str | None:
    """What a file's size and digests (as read) say against its manifest entry, or None."""
    if problem := size_problem(where, size, want):
        return problem
    if digest != want["xxh3"]:
        return f"{where}: checksum mismatch (xxh3 {digest} != {want['xxh3']})"
    if key is not None and not hmac.compare_digest(str(want.get(KEYED, "")), keyed or "-"):
        return f"{where}: keyed digest mismatch"
    return None


def verify_metadata(fs, directory: str, commit: dict[str, Any], key: bytes | None = None) -> None:
    """DCP's .metadata against COMMIT (and its keyed digest) before DCP reads it."""
    with fs.open(f"{directory}/.metadata", "rb") as f:
        data = f.read()
    if digest_bytes(data) != commit["metadata_xxh3"]:
        raise CorruptCheckpoint(f"{directory}/.metadata: checksum mismatch")
    if key is not None and not hmac.compare_digest(str(commit["keyed"]["metadata"]), keyed_digest(key, data)):
        raise CorruptCheckpoint(f"{directory}/.metadata: keyed digest mismatch")


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
