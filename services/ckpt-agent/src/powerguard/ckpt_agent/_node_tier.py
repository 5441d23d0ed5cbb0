"""The node-local tier (``local_scope="node"``; see ``_nodes``): the commit on every node,
replication to peers in the background, restore from wherever a verified copy is. Behind
the same interface as the shared tier (``_tiers.Tier``), plus :meth:`NodeTier.restore`."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

from . import _layout as L
from ._metadata import SafeFileSystemReader
from ._nodes import Topology, exchange, node_files, verified_here
from ._ranks import Ranks
from ._restore import Floor, Restored, check_world, commit_saga, load
from ._retainer import Retainer
from ._state import TrainingState
from ._tiers import Written, commit_written
from .errors import CheckpointError, CommitError, CorruptCheckpoint

log = logging.getLogger("powerguard.ckpt_agent")


class NodeTier:
    """Each node's own disk; ``topo`` says which node every rank is on (gathered at start)."""

    bodies = True

    def __init__(
        self,
        ranks: Ranks,
        fs: Any,
        state: TrainingState,
        *,
        topo: Topology,
        node: str,
        job: str,
        root: str,
        keys: L.Keys | None,
        replicas: int,
        reshard: bool,
        retainer: Retainer,
        on_replicated: Callable[[int, list[tuple[int, str, int]], str, str], None] | None = None,
        readers: int = 1,
    ) -> None:
        self.ranks, self.fs, self.state, self._topo, self.node = ranks, fs, state, topo, node
        self.readers = readers  # files each rank loads at once; the leader verifies its node's with all
        self._node_readers = readers * len(topo.ranks(node))  # the leader alone verifies the node's files
        self.job, self.root, self.replicas, self.reshard = job, root, replicas, reshard
        self.keys = keys
        self.key = keys.job if keys is not None else None  # signs this job's checkpoints
        self.retainer = retainer
        # (step, [(rank, manifest digest, bytes) of this node's ranks], level, directory) once this
        # node's files are on its peers and that raises their durability (the acks say so again)
        self.on_replicated = on_replicated
        self.rank = ranks.rank
        self._needed: dict[str, set[str]] = {}  # what each node keeps for itself (last commit)
        self._replicator: threading.Thread | None = None
        self.replicated: tuple[str, bool, list[str]] | None = None  # (directory, complete, problems), last one

    @property
    def leader(self) -> bool:
        """This rank prepares, commits and replicates its node's directory."""
        return self._topo.leader(self.node) == self.rank

    @property
    def replicating(self) -> bool:
        return self._replicator is not None and self._replicator.is_alive()

    def wait_replicated(self, timeout_s: float | None = None) -> bool:
        """Wait until the last checkpoint's replication to the peers ended; True when it ended
        (``replicated`` then says whether it was complete)."""
        if self._replicator is None:
            return True
        self._replicator.join(timeout_s)
        return not self._replicator.is_alive()

    def _needed_files(self, directory: str) -> set[str]:
        """The data files this rank's restore reads (DCP's own load plan over ``.metadata``)."""
        metadata = SafeFileSystemReader(directory).read_metadata()
        planner = DefaultLoadPlanner()
        planner.set_up_planner(self.state.state_dict(0), metadata, is_coordinator=False)
        return {metadata.storage_data[i.storage_index].relative_path for i in planner.create_local_plan().items}

    def _fill_nodes(
        self,
        directory: str,
        have: dict[str, set[str]],
        files: dict[str, dict[str, Any]],
        needed: dict[str, set[str]],
        key: bytes | None,
    ) -> tuple[list[str], dict[str, int]]:
        """Send every node the data files its ranks need and it does not have, from the nearest
        node before it that has them: ring rounds of :func:`exchange` (round j: from the node j
        before, to the node j after), computed alike on every rank. Returns the problems and, for
        this node, how many files came from which node."""
        ring = self._topo.order
        missing = {n: sorted(needed[n] - have[n]) for n in ring}
        problems: list[str] = []
        fetched: dict[str, int] = {}
        for j in range(1, len(ring)):
            take = {n: [f for f in missing[n] if f in have[ring[(ring.index(n) - j) % len(ring)]]] for n in ring}
            for n in ring:
                missing[n] = [f for f in missing[n] if f not in take[n]]
            if not any(take.values()) or not self.leader:
                continue
            i = ring.index(self.node)
            dst, src = ring[(i + j) % len(ring)], ring[(i - j) % len(ring)]
            problems += exchange(
                [(os.path.join(directory, f), int(files[f]["size"])) for f in take[dst]],
                self._topo.leader(dst),
                [(os.path.join(directory, f), files[f]) for f in take[self.node]],
                self._topo.leader(src),
                self.ranks.save_group,
                key=key,
            )
            if take[self.node]:
                fetched[src] = len(take[self.node])
        problems += [f"node {n}: {', '.join(m[:3])} on no node" for n, m in missing.items() if m]
        return problems, fetched

    # ------------------------------------------------------------------ commit
    def commit(self, directory: str, step: int, written: list[Written], *, saga_id: str | None) -> str:
        """Commit on every node, then replicate in the background; the durability."""
        extra = {"saga_id": saga_id} if saga_id else None
        durability = self._commit_on_every_node(directory, step, written, extra)
        if durability is None:
            raise CommitError(f"not every node could write COMMIT in {directory}")
        self._replicate_in_background(directory, step, written, durability)
        return durability

    def _commit_on_every_node(
        self, directory: str, step: int, results: list[Written], extra: dict | None
    ) -> str | None:
        """Phase 2 of a node-local commit (phase 1: every rank's files and manifest durable on its
        own node, gathered in ``results`` with the manifest bodies and rank 0's ``.metadata``).
        Each node leader stores the other nodes' manifests and ``.metadata``; each node receives
        the data files its ranks' restore reads (DCP dedups replicated tensors onto one rank);
        once every node holds all it needs, each writes the same ``COMMIT``."""
        meta = results[0].meta
        ok = True
        if self.leader:
            try:
                for w in results:
                    if self._topo.nodes[w.rank] != self.node:
                        L.write_durable(self.fs, os.path.join(directory, L.manifest_name(w.rank)), w.body)
                if self._topo.nodes[0] != self.node:
                    L.write_durable(self.fs, os.path.join(directory, ".metadata"), meta)
            except OSError as exc:
                log.error("rank %d: storing the other nodes' manifests in %s failed: %s", self.rank, directory, exc)
                ok = False
        if not self.ranks.all_ok(ok):
            return None
        manifests = {w.rank: json.loads(w.body)["files"] for w in results}
        files = {f: e for fl in manifests.values() for f, e in fl.items()}
        have = {n: set(node_files(self._topo, n, manifests)) for n in self._topo.order}
        needed = self._needed_by_node(directory)
        problems, _ = self._fill_nodes(directory, have, files, needed, self.key)
        if problems:
            log.error("rank %d: %s", self.rank, "; ".join(problems))
        if not self.ranks.all_ok(not problems):
            return None
        self._needed = needed  # what each node keeps for itself: replication sends the rest
        # every file is now on its own node and on each node that needs it: the fewest copies of any file
        copies = min((sum(f in have[n] or f in needed[n] for n in have) for f in files), default=1)
        durability = f"replicated:{copies - 1}" if copies > 1 else "local"
        if self.leader:
            log.info("rank %d: %s ready on node %s, durability %s", self.rank, directory, self.node, durability)
        committed = True
        if self.leader:
            try:
                commit_written(
                    self.fs,
                    directory,
                    job=self.job,
                    tier="node",
                    step=step,
                    world_size=self.ranks.world_size,
                    written=results,
                    meta=meta,
                    key=self.key,
                    extra={**(extra or {}), "nodes": {str(r): n for r, n in enumerate(self._topo.nodes)}},
                )
                self.retainer.start()
            except OSError as exc:
                log.error("rank %d: COMMIT of %s on node %s failed: %s", self.rank, directory, self.node, exc)
                committed = False
        return durability if self.ranks.all_ok(committed) else None

    def _needed_by_node(self, directory: str) -> dict[str, set[str]]:
        mine: set[str] | str
        try:
            mine = self._needed_files(directory)
        except Exception as exc:
            mine = f"rank {self.rank}: cannot plan the restore from {directory}: {exc}"
        got = self.ranks.gather(mine)
        bad = [g for g in got if isinstance(g, str)]
        if bad:
            raise CheckpointError("; ".join(bad))
        out: dict[str, set[str]] = {n: set() for n in self._topo.order}
        for r, names in enumerate(got):
            out[self._topo.nodes[r]] |= names
        return out

    # ------------------------------------------------------------------ replication
    def _replicate_in_background(self, directory: str, step: int, results: list[Written], committed: str) -> None:
        """Send this node's own ranks' data files to the ``replicas`` nodes after it (those they
        do not hold already) and take those of the nodes before it; leaders only, on their own
        gloo group, one checkpoint after another. The local commit does not wait for it."""
        if not self.ranks.distributed or self.replicas < 1 or not self.leader or len(self._topo.order) < 2:
            return
        manifests = {w.rank: json.loads(w.body)["files"] for w in results}
        needed, previous = self._needed, self._replicator

        def run() -> None:
            if previous is not None:
                previous.join()
            t0 = time.perf_counter()
            problems: list[str] = []
            ring = self._topo.order
            i = ring.index(self.node)
            for j in range(1, min(self.replicas, len(ring) - 1) + 1):
                dst, src = ring[(i + j) % len(ring)], ring[(i - j) % len(ring)]
                out = node_files(self._topo, self.node, manifests)
                inc = node_files(self._topo, src, manifests)
                try:
                    problems += exchange(
                        [
                            (os.path.join(directory, n), int(f["size"]))
                            for n, f in sorted(out.items())
                            if n not in needed[dst]
                        ],
                        self._topo.leader(dst),
                        [(os.path.join(directory, n), f) for n, f in sorted(inc.items()) if n not in needed[self.node]],
                        self._topo.leader(src),
                        self.ranks.replica_group,
                        key=self.key,
                    )
                except (RuntimeError, OSError) as exc:  # a peer gone: the local commit stands
                    problems.append(f"with nodes {dst}/{src}: {exc}")
                    break
            self.replicated = (directory, not problems, problems)
            if problems:
                log.error("rank %d: replication of %s incomplete: %s", self.rank, directory, "; ".join(problems))
            else:
                k = min(self.replicas, len(ring) - 1)
                took = time.perf_counter() - t0
                log.info("rank %d: %s replicated to %d peer node(s) in %.2fs", self.rank, directory, k, took)
                if self.on_replicated is not None and _copies(committed) < k:  # the commit said less
                    mine = [w for w in results if self._topo.nodes[w.rank] == self.node]
                    sizes = {w.rank: sum(int(f["size"]) for f in manifests[w.rank].values()) for w in mine}
                    done = [(w.rank, w.digest, sizes[w.rank]) for w in mine]
                    self.on_replicated(step, done, f"replicated:{k}", directory)

        self._replicator = threading.Thread(target=run, name="pg-ckpt-replicate", daemon=True)
        self._replicator.start()

    # ------------------------------------------------------------------ restore
    def restore(self, newer_than: int | None = None, floor: Floor | None = None) -> tuple[Restored | None, list[str]]:
        """The newest step (above ``newer_than``) every file of which is verified on some node:
        each node gets what its ranks need and it lacks from a node that has it, then DCP loads
        from the local directory. (None, the committed steps refused with why) when there is none.
        ``floor``: what the coordinator recorded for the job (an older step is a rollback, the
        recorded step's copy must be the one its acks named)."""
        mine = [s for s, _ in L.list_steps(self.fs, self.root, self.job)] if self.leader else []
        every = {s for got in self.ranks.gather(mine) for s in got}
        steps = sorted((s for s in every if newer_than is None or s > newer_than), reverse=True)
        refused: list[str] = []
        for step in steps:
            directory = L.step_dir(self.root, self.job, step)
            if floor is not None and (why := floor.refusal(step)):
                refused.append(f"{directory}: {why}")
                continue
            try:
                reason, fetched = self._gather_checkpoint(directory, step, floor.named(step) if floor else None)
            except CheckpointError as exc:
                reason, fetched = str(exc), ""
            if reason:
                log.warning("rank %d: skipping node-local checkpoint %s: %s", self.rank, directory, reason)
                if "no node has its COMMIT" not in reason:  # some node committed it
                    refused.append(f"{directory}: {reason}")
                continue
            loaded, seconds = load(self.state, SafeFileSystemReader(directory, threads=self.readers), self.ranks)
            source = f"peer ({fetched})" if fetched else "local"
            log.info(
                "rank %d: restored step %d from the node-local tier, %s (%s)", self.rank, loaded, source, directory
            )
            saga = commit_saga(self.fs, directory, self.rank)
            return Restored(loaded, "peer" if fetched else "local", saga, seconds), refused
        return None, refused

    def _reference_commit(
        self, directory: str, step: int, named: str | None
    ) -> tuple[dict | None, bytes | None, str, bytes | None]:
        """The checkpoint's COMMIT as some node holds it: this job's, of this step, of this tier,
        authenticated with the key; with ``named`` (the COMMIT the job's acks named, as the
        coordinator recorded it) that one only, never merely the first that authenticates. Returns
        (it, its bytes, why there is none, the key that signed it)."""
        raw = None
        if self.leader:
            try:
                with open(os.path.join(directory, L.COMMIT), "rb") as f:
                    raw = f.read()
            except OSError:
                raw = None
        why = []
        for r, body in enumerate(self.ranks.gather(raw)):
            if body is None:
                continue
            where = f"{directory} on node {self._topo.nodes[r]}"
            try:
                c = json.loads(body)
                L.check_binding(c, job=self.job, step=step, tier="node", where=where)
                key = self.keys.for_commit(c, where) if self.keys is not None else None
                L.authenticate(c, key, where)
                if named is not None and L.commit_id(c) != named:
                    raise CorruptCheckpoint(f"{where}: not the checkpoint the job's acks named (another copy)")
                check_world(c, world_size=self.ranks.world_size, reshard=self.reshard, rank=self.rank)
                return c, body, "", key
            except (CorruptCheckpoint, ValueError) as exc:
                why.append(str(exc))
        return None, None, "; ".join(why) or "no node has its COMMIT", None

    def _gather_checkpoint(self, directory: str, step: int, named: str | None = None) -> tuple[str | None, str]:
        """Make ``directory`` complete on every node for its own ranks. Returns (why not, what
        this node fetched)."""
        commit, commit_raw, why, key = self._reference_commit(directory, step, named)
        if commit is None:
            return why, ""
        have, manifests, bad = (
            verified_here(directory, commit, key, threads=self._node_readers) if self.leader else (set(), {}, [])
        )
        for b in bad:  # a copy that does not verify is never a source; another node's copy is used
            log.warning("rank %d: node %s's copy skipped: %s", self.rank, self.node, b)
        # the small files (COMMIT, manifests, .metadata) from the first node that has each
        small = {L.manifest_name(int(r)) for r in commit["manifests"]} | {".metadata"}
        offer = {}
        if self.leader:
            offer = {n: _read_bytes(directory, n) for n in small if n in have}
        reports = self.ranks.gather((have, manifests, offer) if self.leader else None)
        problems: list[str] = []
        if self.leader:
            problems = self._store_small(directory, commit, commit_raw, small, have, reports, key)
        reasons = [p for got in self.ranks.gather(problems) for p in got]
        if reasons:
            return "; ".join(reasons), ""
        lists: dict[int, dict[str, Any]] = {}
        for rep in reports:
            if rep is not None:
                lists.update(rep[1])
        files = {f: e for fl in lists.values() for f, e in fl.items()}
        holds = {n: set(reports[self._topo.leader(n)][0]) for n in self._topo.order}
        needed = self._needed_by_node(directory)
        problems, fetched = self._fill_nodes(directory, holds, files, needed, key)
        reasons = [p for got in self.ranks.gather(problems) for p in got]
        if reasons:
            return "; ".join(reasons), ""
        node_fetched = self.ranks.gather(fetched if self.leader else None)[self._topo.leader(self.node)]
        return None, ", ".join(f"{k} file(s) from node {s}" for s, k in sorted(node_fetched.items()))

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
            problems.append(f"node {self.node}: {exc}")
        return problems


def _commit_id_at(directory: str) -> str | None:
    """The contents' id of the COMMIT in ``directory`` (None: none, or unreadable)."""
    try:
        with open(os.path.join(directory, L.COMMIT), "rb") as f:
            return L.commit_id(json.loads(f.read()))
    except (OSError, ValueError):
        return None


def _copies(durability: str) -> int:
    """Peer copies a durability level says: ``local`` 0, ``replicated:k`` k."""
    head, _, k = durability.partition(":")
    return int(k) if head == "replicated" and k.isdigit() else 0


def _small_mismatch(commit: dict[str, Any], name: str, body: bytes, key: bytes | None) -> str | None:
    """Why a manifest or ``.metadata`` received from a peer does not match COMMIT (None: it does)."""
    if name == ".metadata":
        want, keyed = commit["metadata_xxh3"], (commit.get("keyed") or {}).get("metadata")
    else:
        rank = name.removeprefix("MANIFEST.rank").removesuffix(".json")
        want, keyed = commit["manifests"].get(rank), ((commit.get("keyed") or {}).get("manifests") or {}).get(rank)
    if L.digest_bytes(body) != want:
        return "does not match COMMIT"
    if key is not None and L.keyed_digest(key, body) != keyed:
        return "does not match its keyed digest"
    return None


def _read_bytes(directory: str, name: str) -> bytes:
    with open(os.path.join(directory, name), "rb") as f:
        return f.read()
