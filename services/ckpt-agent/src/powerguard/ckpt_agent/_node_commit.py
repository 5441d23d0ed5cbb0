"""The node-local tier's commit: every node stores the others' manifests and ``.metadata``,
receives the data files its ranks' restore reads, and writes the same ``COMMIT``."""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from . import _layout as L
from ._node_exchange import NodeExchange
from ._nodes import node_files
from ._retainer import Retainer
from ._tiers import Written, commit_written

log = logging.getLogger("powerguard.ckpt_agent")


class NodeCommitter:
    def __init__(self, ex: NodeExchange, fs: Any, *, job: str, key: bytes | None, retainer: Retainer) -> None:
        self.ex, self.fs, self.job, self.key, self.retainer = ex, fs, job, key, retainer
        self.needed: dict[str, set[str]] = {}  # what each node keeps for itself (last commit)

    def commit(self, directory: str, step: int, results: list[Written], extra: dict | None) -> str | None:
        """Phase 2 of a node-local commit (phase 1: every rank's files and manifest durable on its
        own node, gathered in ``results`` with the manifest bodies and rank 0's ``.metadata``).
        Each node leader stores the other nodes' manifests and ``.metadata``; each node receives
        the data files its ranks' restore reads (DCP dedups replicated tensors onto one rank);
        once every node holds all it needs, each writes the same ``COMMIT``."""
        meta = results[0].meta
        ok = True
        if self.ex.leader:
            try:
                for w in results:
                    if self.ex.topo.nodes[w.rank] != self.ex.node:
                        L.write_durable(self.fs, os.path.join(directory, L.manifest_name(w.rank)), w.body)
                if self.ex.topo.nodes[0] != self.ex.node:
                    L.write_durable(self.fs, os.path.join(directory, ".metadata"), meta)
            except OSError as exc:
                log.error("rank %d: storing the other nodes' manifests in %s failed: %s", self.ex.rank, directory, exc)
                ok = False
        if not self.ex.ranks.all_ok(ok):
            return None
        manifests = {w.rank: json.loads(w.body)["files"] for w in results}
        files = {f: e for fl in manifests.values() for f, e in fl.items()}
        have = {n: set(node_files(self.ex.topo, n, manifests)) for n in self.ex.topo.order}
        needed = self.ex.needed_by_node(directory)
        problems, _ = self.ex.fill(directory, have, files, needed, self.key)
        if problems:
            log.error("rank %d: %s", self.ex.rank, "; ".join(problems))
        if not self.ex.ranks.all_ok(not problems):
            return None
        self.needed = needed  # what each node keeps for itself: replication sends the rest
        # every file is now on its own node and on each node that needs it: the fewest copies of any file
        copies = min((sum(f in have[n] or f in needed[n] for n in have) for f in files), default=1)
        durability = f"replicated:{copies - 1}" if copies > 1 else "local"
        if self.ex.leader:
            log.info("rank %d: %s ready on node %s, durability %s", self.ex.rank, directory, self.ex.node, durability)
        committed = True
        if self.ex.leader:
            try:
                commit_written(
                    self.fs,
                    directory,
                    job=self.job,
                    tier="node",
                    step=step,
                    world_size=self.ex.ranks.world_size,
                    written=results,
                    meta=meta,
                    key=self.key,
                    extra={**(extra or {}), "nodes": {str(r): n for r, n in enumerate(self.ex.topo.nodes)}},
                )
                self.retainer.start()
            except OSError as exc:
                log.error("rank %d: COMMIT of %s on node %s failed: %s", self.ex.rank, directory, self.ex.node, exc)
                committed = False
        return durability if self.ex.ranks.all_ok(committed) else None
