"""The node-local tier's restore: the newest step every file of which is verified on some node;
each node gets what its ranks need and it lacks from a node that has it, then DCP loads from the
local directory. Only the job's own COMMIT of that step and tier is a reference (the one the
job's acks named, when the coordinator recorded it); a node's differing COMMIT is replaced."""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from . import _keys as K
from . import _layout as L
from ._metadata import SafeFileSystemReader
from ._node_exchange import NodeExchange
from ._nodes import verified_here
from ._restore import Floor, Restored, check_world, commit_saga, load
from .errors import CheckpointError, CorruptCheckpoint, IncompleteOnNodes, NotCommittedAnywhere

log = logging.getLogger("powerguard.ckpt_agent")


class NodeRestorer:
    def __init__(
        self, ex: NodeExchange, fs: Any, *, job: str, root: str, keys: K.Keys | None, reshard: bool, readers: int
    ) -> None:
        self.ex, self.fs, self.job, self.root, self.keys, self.reshard = ex, fs, job, root, keys, reshard
        self.readers = readers  # files each rank loads at once; the leader verifies its node's with all
        self._node_readers = readers * len(ex.topo.ranks(ex.node))

    def restore(self, newer_than: int | None = None, floor: Floor | None = None) -> tuple[Restored | None, list[str]]:
        """The newest step (above ``newer_than``) every file of which is verified on some node:
        each node gets what its ranks need and it lacks from a node that has it, then DCP loads
        from the local directory. (None, the committed steps refused with why) when there is none.
        ``floor``: what the coordinator recorded for the job (an older step is a rollback, the
        recorded step's copy must be the one its acks named)."""
        mine = [s for s, _ in L.list_steps(self.fs, self.root, self.job)] if self.ex.leader else []
        every = {s for got in self.ex.ranks.gather(mine) for s in got}
        steps = sorted((s for s in every if newer_than is None or s > newer_than), reverse=True)
        refused: list[str] = []
        for step in steps:
            directory = L.step_dir(self.root, self.job, step)
            if floor is not None and (why := floor.refusal(step)):
                refused.append(f"{directory}: {why}")
                continue
            try:
                fetched = self._gather_checkpoint(directory, step, floor.named(step) if floor else None)
            except NotCommittedAnywhere as exc:  # a save cut before its commit: no candidate, nothing refused
                log.warning("rank %d: skipping node-local checkpoint %s: %s", self.ex.rank, directory, exc)
                continue
            except CheckpointError as exc:  # some node committed it, and it cannot be restored
                log.warning("rank %d: skipping node-local checkpoint %s: %s", self.ex.rank, directory, exc)
                refused.append(f"{directory}: {exc}")
                continue
            loaded, seconds = load(self.ex.state, SafeFileSystemReader(directory, threads=self.readers), self.ex.ranks)
            source = f"peer ({fetched})" if fetched else "local"
            log.info(
                "rank %d: restored step %d from the node-local tier, %s (%s)", self.ex.rank, loaded, source, directory
            )
            saga = commit_saga(self.fs, directory, self.ex.rank)
            return Restored(loaded, "peer" if fetched else "local", saga, seconds), refused
        return None, refused

    def _reference_commit(self, directory: str, step: int, named: str | None) -> tuple[dict, bytes, bytes | None]:
        """The checkpoint's COMMIT as some node holds it: this job's, of this step, of this tier,
        authenticated with the key; with ``named`` (the COMMIT the job's acks named, as the
        coordinator recorded it) that one only, never merely the first that authenticates. Returns
        (it, its bytes, the key that signed it); raises :class:`NotCommittedAnywhere` when no node
        holds one, :class:`CorruptCheckpoint` (every node's reason) when none is the reference."""
        raw = None
        if self.ex.leader:
            try:
                with open(os.path.join(directory, L.COMMIT), "rb") as f:
                    raw = f.read()
            except OSError:
                raw = None
        why = []
        for r, body in enumerate(self.ex.ranks.gather(raw)):
            if body is None:
                continue
            where = f"{directory} on node {self.ex.topo.nodes[r]}"
            try:
                c = json.loads(body)
                L.check_binding(c, job=self.job, step=step, tier="node", where=where)
                key = self.keys.for_commit(c, where) if self.keys is not None else None
                L.authenticate(c, key, where)
                if named is not None and L.commit_id(c) != named:
                    raise CorruptCheckpoint(f"{where}: not the checkpoint the job's acks named (another copy)")
                check_world(c, world_size=self.ex.ranks.world_size, reshard=self.reshard, rank=self.ex.rank)
                return c, body, key
            except (CorruptCheckpoint, ValueError) as exc:
                why.append(str(exc))
        if not why:
            raise NotCommittedAnywhere(f"{directory}: no node has its COMMIT")
        raise CorruptCheckpoint("; ".join(why))

    def _gather_checkpoint(self, directory: str, step: int, named: str | None = None) -> str:
        """Make ``directory`` complete on every node for its own ranks; returns what this node
        fetched (empty: nothing). Raises :class:`IncompleteOnNodes` when it cannot."""
        commit, commit_raw, key = self._reference_commit(directory, step, named)
        have, manifests, bad = (
            verified_here(directory, commit, key, threads=self._node_readers) if self.ex.leader else (set(), {}, [])
        )
        for b in bad:  # a copy that does not verify is never a source; another node's copy is used
            log.warning("rank %d: node %s's copy skipped: %s", self.ex.rank, self.ex.node, b)
        # the small files (COMMIT, manifests, .metadata) from the first node that has each
        small = {L.manifest_name(int(r)) for r in commit["manifests"]} | {".metadata"}
        offer = {}
        if self.ex.leader:
            offer = {n: _read_bytes(directory, n) for n in small if n in have}
        reports = self.ex.ranks.gather((have, manifests, offer) if self.ex.leader else None)
        problems: list[str] = []
        if self.ex.leader:
            problems = self._store_small(directory, commit, commit_raw, small, have, reports, key)
        reasons = [p for got in self.ex.ranks.gather(problems) for p in got]
        if reasons:
            raise IncompleteOnNodes("; ".join(reasons))
        lists: dict[int, dict[str, Any]] = {}
        for rep in reports:
            if rep is not None:
                lists.update(rep[1])
        files = {f: e for fl in lists.values() for f, e in fl.items()}
        holds = {n: set(reports[self.ex.topo.leader(n)][0]) for n in self.ex.topo.order}
        needed = self.ex.needed_by_node(directory)
        problems, fetched = self.ex.fill(directory, holds, files, needed, key)
        reasons = [p for got in self.ex.ranks.gather(problems) for p in got]
        if reasons:
            raise IncompleteOnNodes("; ".join(reasons))
        node_fetched = self.ex.ranks.gather(fetched if self.ex.leader else None)[self.ex.topo.leader(self.ex.node)]
        return ", ".join(f"{k} file(s) from node {s}" for s, k in sorted(node_fetched.items()))

    def _store_small(self, directory, commit, commit_raw, small, have, reports, key) -> list[str]:
        """A leader writes the COMMIT, manifests and ``.metadata`` its node lacks, each checked
        against COMMIT's digests (and keyed digests) before it is written; a COMMIT of other
        contents than the reference's (planted, or of another save) is replaced by it."""
        problems = []
        try:
            L.makedirs_durable(directory)
            if _commit_id_at(directory) != L.commit_id(commit):
                L.write_durable(self.fs, os.path.join(directory, L.COMMIT), commit_raw)
            for name in sorted(small - have):
                body = next((rep[2][name] for rep in reports if rep is not None and name in rep[2]), None)
                wrong = "verified on no node" if body is None else _small_mismatch(commit, name, body, key)
                if wrong:
                    problems.append(f"{name}: {wrong}")
                    continue
                L.write_durable(self.fs, os.path.join(directory, name), body)
        except OSError as exc:
            problems.append(f"node {self.ex.node}: {exc}")
        return problems


def _commit_id_at(directory: str) -> str | None:
    """The contents' id of the COMMIT in ``directory`` (None: none, or unreadable)."""
    try:
        with open(os.path.join(directory, L.COMMIT), "rb") as f:
            return L.commit_id(json.loads(f.read()))
    except (OSError, ValueError):
        return None


def _small_mismatch(commit: dict[str, Any], name: str, body: bytes, key: bytes | None) -> str | None:
    """Why a manifest or ``.metadata`` received from a peer does not match COMMIT (None: it does)."""
    if name == ".metadata":
        want, keyed = commit["metadata_xxh3"], (commit.get("keyed") or {}).get("metadata")
    else:
        rank = name.removeprefix("MANIFEST.rank").removesuffix(".json")
        want, keyed = commit["manifests"].get(rank), ((commit.get("keyed") or {}).get("manifests") or {}).get(rank)
    if L.digest_bytes(body) != want:
        return "does not match COMMIT"
    if key is not None and K.keyed_digest(key, body) != keyed:
        return "does not match its keyed digest"
    return None


def _read_bytes(directory: str, name: str) -> bytes:
    with open(os.path.join(directory, name), "rb") as f:
        return f.read()
