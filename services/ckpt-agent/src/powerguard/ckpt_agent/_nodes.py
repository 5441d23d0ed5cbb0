"""The node-local tier (``local_scope="node"``): every node's disk holds a checkpoint that a
restore on that node can use without reading another node's disk.

On each node, under the same ``<root>/<job>/step-<N>/``:

* the data files of the node's own ranks (DCP writes them there);
* a copy of DCP's ``.metadata`` and of every rank's manifest (sent over the agent's gloo group);
* ``COMMIT``, written on every node only after every node reported its files and manifests
  durable: the job-wide commit decision, recorded on each node (the same bytes everywhere);
* after the commit, in the background, replicas of the data files of the ``k`` nodes before it
  in ring order (each node's files go to the ``k`` nodes after it), verified on arrival.

Before COMMIT, each node also receives the data files its own ranks' restore reads (DCP's load
plan over ``.metadata``: DCP stores a replicated tensor once, on one rank, so with DDP every
node needs every rank's share of the model): a node can restore from its own disk alone.

A restore agrees on one step, finds for every file a node that holds it verified, and sends
each node what its ranks need and it lacks (a replaced node with an empty disk gets it all)
before DCP reads its local directory. Files travel between the nodes' first ranks ("leaders")
as uint8 tensors over point-to-point gloo messages, in ring rounds (round j: to the node j
after, from the node j before) in lockstep chunks whose sizes both sides know from the
manifests, so a missing or short file never leaves a peer waiting: it fails its checksum.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import xxhash

from . import _keys as K
from . import _layout as L
from .errors import CorruptCheckpoint

log = logging.getLogger("powerguard.ckpt_agent")

CHUNK = 16 * 1024 * 1024


@dataclass(frozen=True)
class Topology:
    """Which node each rank runs on (index = rank), as every rank reported it."""

    nodes: tuple[str, ...]

    @property
    def order(self) -> list[str]:
        """The job's nodes in the order of their first rank (the replication ring)."""
        return list(dict.fromkeys(self.nodes))

    def leader(self, node: str) -> int:
        return self.nodes.index(node)

    def ranks(self, node: str) -> list[int]:
        return [r for r, n in enumerate(self.nodes) if n == node]


def node_files(topo: Topology, node: str, manifests: dict[int, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The data files the ranks of ``node`` wrote (from their manifests), by name."""
    out: dict[str, dict[str, Any]] = {}
    for r in topo.ranks(node):
        out.update(manifests.get(r, {}))
    return out


def verified_here(
    directory: str, commit: dict[str, Any], key: bytes | None, *, threads: int = 1
) -> tuple[set[str], dict[int, dict], list[str]]:
    """What this node holds of a checkpoint, checked against ``commit``: the names of the verified
    files (manifests, ``.metadata``, data files), the manifests' file lists by rank, and what is
    present but bad (with the reason). ``threads`` data files are read at once (the node's
    disk reads faster with a few streams)."""
    fs = L.fs_for(directory)[0]
    have: set[str] = set()
    bad: list[str] = []
    manifests: dict[int, dict[str, Any]] = {}
    for rank in commit["manifests"]:
        one = {**commit, "manifests": {rank: commit["manifests"][rank]}}
        if key is not None:
            one["keyed"] = {**commit["keyed"], "manifests": {rank: commit["keyed"]["manifests"].get(rank, "")}}
        try:
            manifests[int(rank)] = L.manifest_files(fs, directory, one, key)
            have.add(L.manifest_name(int(rank)))
        except (OSError, ValueError, KeyError):
            continue
        except CorruptCheckpoint as exc:
            if "missing" not in str(exc):
                bad.append(str(exc))
    try:
        L.verify_metadata(fs, directory, commit, key)
        have.add(".metadata")
    except FileNotFoundError:
        pass
    except (CorruptCheckpoint, OSError) as exc:
        bad.append(f"{directory}/.metadata: {exc}")

    def check(item: tuple[str, dict[str, Any]]) -> str | None:
        name, want = item
        try:
            return L.file_problem(fs, directory, name, want, key)
        except OSError as exc:
            return f"{directory}/{name}: {exc}"

    items = [(name, want) for files in manifests.values() for name, want in files.items()]
    with ThreadPoolExecutor(max(1, min(threads, len(items))), thread_name_prefix="pg-ckpt-verify") as pool:
        for (name, _), problem in zip(items, pool.map(check, items), strict=True):
            if problem is None:
                have.add(name)
            elif not problem.endswith(": missing"):
                bad.append(problem)
    return have, manifests, bad


def exchange(
    out: list[tuple[str, int]],
    dst: int | None,
    inc: list[tuple[str, dict[str, Any]]],
    src: int | None,
    group,
    *,
    key: bytes | None = None,
) -> list[str]:
    """Send ``out`` (path, manifest size) to ``dst`` while receiving ``inc`` (path, manifest entry)
    from ``src``, chunk by chunk in lockstep: both sides know every size from the manifests, so
    neither waits on the other (a missing or short file is sent as zeros and fails its checksum
    on arrival). Returns the problems with what arrived (empty: all verified and stored)."""
    sends = [(p, off, n) for p, size in out for off, n in _chunks(size)]
    recvs = [(p, w, off, n) for p, w in inc for off, n in _chunks(int(w["size"]))]
    handles: dict[str, Any] = {}
    hashers: dict[str, Any] = {}
    keyed: dict[str, Any] = {}
    problems: list[str] = []
    try:
        for t in range(max(len(sends), len(recvs))):
            work = None
            if t < len(sends):
                path, off, n = sends[t]
                work = dist.isend(_read(path, off, n), dst=dst, group=group)
            if t < len(recvs):
                path, want, off, n = recvs[t]
                buf = torch.empty(n, dtype=torch.uint8)
                dist.recv(buf, src=src, group=group)
                if path not in handles:
                    handles[path] = open(f"{path}.recv", "wb")
                    hashers[path] = xxhash.xxh3_128()
                    keyed[path] = K.keyed_hasher(key) if key is not None else None
                data = buf.numpy().tobytes()
                handles[path].write(data)
                hashers[path].update(data)
                if keyed[path] is not None:
                    keyed[path].update(data)
            if work is not None:
                work.wait()
    finally:
        for f in handles.values():
            f.flush()
            os.fsync(f.fileno())
            f.close()
    for path, want in inc:
        tmp = f"{path}.recv"
        if want["size"] == 0:
            open(tmp, "wb").close()
            hashers[path] = xxhash.xxh3_128()
            keyed[path] = K.keyed_hasher(key) if key is not None else None
        wrong = None
        if hashers[path].hexdigest() != want["xxh3"]:
            wrong = "checksum mismatch"
        elif keyed[path] is not None and keyed[path].hexdigest() != want.get(K.KEYED):
            wrong = "keyed digest mismatch"
        if wrong:
            os.unlink(tmp)
            problems.append(f"{os.path.basename(path)} from rank {src}: {wrong}")
            continue
        os.replace(tmp, path)
    if inc:
        L.fsync_dir(os.path.dirname(inc[0][0]))
    return problems


def confirm(stored: bool, to: int, frm: int, group) -> bool:
    """After an :func:`exchange`: this node's verdict on what it received goes back to its sender
    (``to``: ``src`` of the exchange) while the verdict of this node's receiver (``frm``: its
    ``dst``) arrives. True when the receiver says it verified and fsynced every file it got. A
    sender never speaks for its receiver: the raise of its ranks waits on this."""
    verdict = torch.tensor([1 if stored else 0], dtype=torch.uint8)
    work = dist.isend(verdict, dst=to, group=group)
    got = torch.zeros(1, dtype=torch.uint8)
    dist.recv(got, src=frm, group=group)
    work.wait()
    return bool(got.item())


def _chunks(size: int) -> list[tuple[int, int]]:
    return [(off, min(CHUNK, size - off)) for off in range(0, size, CHUNK)]


def _read(path: str, off: int, n: int) -> torch.Tensor:
    data = b""
    try:
        with open(path, "rb") as f:
            f.seek(off)
            data = f.read(n)
    except OSError:
        pass
    return torch.frombuffer(bytearray(data.ljust(n, b"\0")), dtype=torch.uint8)
