"""Back up and restore a deployment's JetStream state through the server's own snapshot API
(``$JS.API.STREAM.SNAPSHOT`` / ``RESTORE``, what ``nats stream backup`` uses): the events stream
and every KV bucket of lasting state (``pg_sagas``, the ``pg_power`` ledger, ``pg_ups`` with the
event-id secret, ``pg_leases``, each job's restore floor in ``pg_floors``), each with its
durable consumers and their positions. Not the agent registry (``pg_agents``): soft state in the
servers' memory that every live rank writes again at its next heartbeat (bus/agents.py); the
coordinator creates it on a restored broker. Live: the broker keeps serving while it is read. With the admin credential.

A backup is a directory: ``<stream>.json`` (the stream's configuration and state when read)
and ``<stream>.snapshot`` (the server's snapshot bytes, S2-compressed tar, kept as they came),
written to temporary names, fsynced, then renamed; ``manifest.json`` last, naming each file's
size and SHA-256. A restore checks the manifest first and refuses a stream that already exists.

A backup holds the deployment's secrets (the event-id key in ``pg_ups``): every file is 0600 in
a 0700 directory. It never overwrites the only good copy: a new one is written beside the old
(``<dir>.partial``) and takes its name only when complete; the one it replaces is kept as
``<dir>.previous`` (:func:`rotate_into`).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from powerguard.schemas.file_modes import write_private

from .client import Bus
from .errors import BusError

CHUNK = 128 * 1024


class BackupError(BusError):
    """A backup or a restore could not be made; the message says which stream and why."""


def streams_of(bus: Bus) -> list[str]:
    n = bus.names
    return [n.stream, n.jobs_stream, *(f"KV_{b}" for b in (n.sagas, n.status, n.power, n.ups, n.leases, n.floors))]


@dataclass(frozen=True)
class Saved:
    stream: str
    bytes: int
    messages: int


def _api_error(reply: dict, what: str) -> None:
    if reply.get("error"):
        err = reply["error"]
        raise BackupError(f"{what}: {err.get('description', err)} (code {err.get('code')})")


async def _request(bus: Bus, subject: str, payload: dict | bytes, timeout: float) -> dict:
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    try:
        msg = await bus.nc.request(subject, data, timeout=timeout)
    except TimeoutError:
        raise BackupError(f"{subject}: no answer within {timeout:g}s (is this the admin credential?)") from None
    return json.loads(msg.data or b"{}")


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def previous_of(path: Path) -> Path:
    return path.with_name(path.name + ".previous")


def rotate_into(partial: Path, final: Path) -> Path | None:
    """``partial`` (complete and fsynced) becomes ``final``; a ``final`` already there is kept as
    ``<final>.previous`` (the older previous deleted first). At every moment one complete copy
    has one of the two names. Returns where the replaced copy went (None: there was none)."""
    kept = None
    if final.exists():
        kept = previous_of(final)
        if kept.is_dir():
            shutil.rmtree(kept)
        elif kept.exists():
            kept.unlink()
        os.replace(final, kept)
    os.replace(partial, final)
    _fsync_dir(final.parent)
    return kept


async def snapshot(bus: Bus, stream: str, directory: Path, *, timeout: float = 30.0) -> Saved:
    """One stream (with its consumers) into ``directory``."""
    inbox = bus.nc.new_inbox()
    chunks: list[bytes] = []
    done: asyncio.Future = asyncio.get_running_loop().create_future()

    async def on_chunk(msg) -> None:
        if not msg.data:  # the end: an empty message (a status header on newer servers)
            if not done.done():
                done.set_result(None)
            return
        chunks.append(bytes(msg.data))
        if msg.reply:  # flow control: the server waits for these acks past its window
            await bus.nc.publish(msg.reply, b"")

    sub = await bus.nc.subscribe(inbox, cb=on_chunk)
    try:
        reply = await _request(
            bus,
            f"$JS.API.STREAM.SNAPSHOT.{stream}",
            {"deliver_subject": inbox, "chunk_size": CHUNK, "jsck": False},
            timeout,
        )
        _api_error(reply, f"snapshot of {stream}")
        try:
            await asyncio.wait_for(done, timeout)
        except TimeoutError:
            raise BackupError(f"snapshot of {stream}: incomplete after {timeout:g}s") from None
    finally:
        await sub.unsubscribe()
    data = b"".join(chunks)
    write_private(directory / f"{stream}.snapshot", data)
    meta = {"config": reply.get("config"), "state": reply.get("state"), "taken": time.time()}
    write_private(directory / f"{stream}.json", json.dumps(meta, indent=2).encode())
    return Saved(stream, len(data), int((reply.get("state") or {}).get("messages", 0)))


async def backup(bus: Bus, directory: Path, *, timeout: float = 30.0) -> list[Saved]:
    """Every PowerGuard stream into ``directory``, then its manifest: written as
    ``<directory>.partial`` (0700) and renamed when complete (:func:`rotate_into`)."""
    directory = Path(directory)
    partial = directory.with_name(directory.name + ".partial")
    if partial.exists():  # an earlier backup that did not finish
        shutil.rmtree(partial)
    directory.parent.mkdir(parents=True, exist_ok=True)
    partial.mkdir(mode=0o700)
    os.chmod(partial, 0o700)
    saved = [await snapshot(bus, s, partial, timeout=timeout) for s in streams_of(bus)]
    _manifest(partial, saved)
    rotate_into(partial, directory)
    return saved


def _manifest(directory: Path, saved: list[Saved]) -> None:
    files = {}
    for s in saved:
        for suffix in (".json", ".snapshot"):
            p = directory / f"{s.stream}{suffix}"
            files[p.name] = {"bytes": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
    manifest = {"streams": [s.stream for s in saved], "files": files, "taken": time.time()}
    write_private(directory / "manifest.json", json.dumps(manifest, indent=2).encode())
    _fsync_dir(directory)


def verify(directory: Path) -> list[str]:
    """The streams of a complete backup; :class:`BackupError` naming the first bad file."""
    try:
        manifest = json.loads((directory / "manifest.json").read_text())
    except (OSError, ValueError) as exc:
        older = previous_of(Path(directory))
        hint = f"; the backup before it is {older}" if (older / "manifest.json").exists() else ""
        raise BackupError(f"{directory}: no readable manifest.json ({exc}): not a complete backup{hint}") from None
    for name, want in manifest["files"].items():
        path = directory / name
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise BackupError(f"{path}: {exc.strerror}") from None
        if len(data) != want["bytes"] or hashlib.sha256(data).hexdigest() != want["sha256"]:
            raise BackupError(f"{path}: not the file the backup wrote (size or SHA-256 differs)")
    return list(manifest["streams"])


def _saved(directory: Path, stream: str) -> tuple[dict, bytes]:
    return json.loads((directory / f"{stream}.json").read_text()), (directory / f"{stream}.snapshot").read_bytes()


async def restore_stream(bus: Bus, stream: str, directory: Path, *, timeout: float = 30.0) -> None:
    meta, data = _saved(directory, stream)
    try:
        await asyncio.wait_for(bus.js.stream_info(stream), timeout)
    except TimeoutError:
        raise BackupError(f"restore of {stream}: no answer (is this the admin credential?)") from None
    except Exception:  # not found: what a restore needs
        pass
    else:
        raise BackupError(f"restore of {stream}: the stream exists on this server; restore onto a fresh broker")
    reply = await _request(
        bus, f"$JS.API.STREAM.RESTORE.{stream}", {"config": meta["config"], "state": meta["state"]}, timeout
    )
    _api_error(reply, f"restore of {stream}")
    target = reply["deliver_subject"]
    for i in range(0, len(data), CHUNK):
        await bus.nc.request(target, data[i : i + CHUNK], timeout=timeout)
    final = await _request(bus, target, b"", timeout)
    _api_error(final, f"restore of {stream}")


async def restore(bus: Bus, directory: Path, *, timeout: float = 30.0) -> list[str]:
    """Every stream of a verified backup onto this (fresh) server."""
    streams = verify(directory)
    for s in streams:
        await restore_stream(bus, s, directory, timeout=timeout)
    return streams
