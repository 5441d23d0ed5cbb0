"""What the node-local tier's parts share: which data files each node's ranks need (DCP's own
load plan) and the ring exchange that sends each node what it lacks from the nearest node that
has it. Used by the commit (:mod:`._node_commit`) and the restore (:mod:`._node_restore`)."""

from __future__ import annotations

import os
from typing import Any

from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

from ._metadata import SafeFileSystemReader
from ._nodes import Topology, exchange
from ._ranks import Ranks
from ._state import TrainingState
from .errors import CheckpointError


class NodeExchange:
    """This rank's place in the node-local tier: its ranks, which node every rank is on, its
    node, and the training state (whose load plan says which files a rank reads)."""

    def __init__(self, ranks: Ranks, topo: Topology, node: str, state: TrainingState) -> None:
        self.ranks, self._topo, self.node, self.state = ranks, topo, node, state
        self.rank = ranks.rank

    @property
    def topo(self) -> Topology:
        return self._topo

    @property
    def leader(self) -> bool:
        """This rank prepares, commits, replicates and restores its node's directory."""
        return self._topo.leader(self.node) == self.rank

    def needed_files(self, directory: str) -> set[str]:
        """The data files this rank's restore reads (DCP's own load plan over ``.metadata``)."""
        metadata = SafeFileSystemReader(directory).read_metadata()
        planner = DefaultLoadPlanner()
        planner.set_up_planner(self.state.state_dict(0), metadata, is_coordinator=False)
        return {metadata.storage_data[i.storage_index].relative_path for i in planner.create_local_plan().items}

    def needed_by_node(self, directory: str) -> dict[str, set[str]]:
        mine: set[str] | str
        try:
            mine = self.needed_files(directory)
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

    def fill(
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
