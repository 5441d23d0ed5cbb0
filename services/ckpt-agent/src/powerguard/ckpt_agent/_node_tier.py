"""The node-local tier (``local_scope="node"``; see ``_nodes``): the commit on every node
(:mod:`._node_commit`), replication to peers in the background (:mod:`._node_replica`),
restore from wherever a verified copy is (:mod:`._node_restore`); what they share (which files
each node needs, the ring exchange) is :mod:`._node_exchange`. Behind the same interface as the
shared tier (``_tiers.Tier``), plus :meth:`NodeTier.restore`."""

from __future__ import annotations

from typing import Any

from . import _keys as K
from ._node_commit import NodeCommitter
from ._node_exchange import NodeExchange
from ._node_replica import OnReplicated, Replicator
from ._node_restore import NodeRestorer
from ._nodes import Topology
from ._ranks import Ranks
from ._restore import Floor, Restored
from ._retainer import Retainer
from ._state import TrainingState
from ._tiers import Written
from .errors import CommitError


class NodeTier:
    """Each node's own disk: a front over its commit, replication and restore."""

    bodies = True

    def __init__(self, committer: NodeCommitter, replicator: Replicator, restorer: NodeRestorer) -> None:
        self.committer, self.replicator, self.restorer = committer, replicator, restorer

    @classmethod
    def build(
        cls,
        place: NodeExchange,
        fs: Any,
        *,
        job: str,
        root: str,
        keys: K.Keys | None,
        replicas: int,
        reshard: bool,
        retainer: Retainer,
        on_replicated: OnReplicated | None = None,
        readers: int = 1,
        gather: bool = False,
    ) -> NodeTier:
        """``gather``: the job has a remote tier, whose copy on rank 0 needs every file on rank 0's
        node (:meth:`Replicator._gather`)."""
        key = keys.job if keys is not None else None  # signs this job's checkpoints
        return cls(
            NodeCommitter(place, fs, job=job, key=key, retainer=retainer),
            Replicator(place, replicas=replicas, key=key, on_replicated=on_replicated, gather=gather),
            NodeRestorer(place, fs, job=job, root=root, keys=keys, reshard=reshard, readers=readers),
        )

    @property
    def leader(self) -> bool:
        """This rank prepares, commits and replicates its node's directory."""
        return self.committer.ex.leader

    @property
    def replicating(self) -> bool:
        return self.replicator.running

    @property
    def replicated(self) -> tuple[str, bool, list[str]] | None:
        """(directory, complete, problems) of the last replication to the peers."""
        return self.replicator.replicated

    def wait_replicated(self, timeout_s: float | None = None) -> bool:
        """Wait until the last checkpoint's replication to the peers ended; True when it ended
        (``replicated`` then says whether it was complete)."""
        return self.replicator.wait(timeout_s)

    def ready(self) -> None:
        pass  # each node's own directory: nothing to establish

    def check(self) -> str | None:
        return None  # each node's own directory: nothing to share

    def commit(self, directory: str, step: int, written: list[Written], *, saga_id: str | None) -> str:
        """Commit on every node, then replicate in the background; the durability."""
        extra = {"saga_id": saga_id} if saga_id else None
        durability = self.committer.commit(directory, step, written, extra)
        if durability is None:
            raise CommitError(f"not every node could write COMMIT in {directory}")
        self.replicator.start(directory, step, written, durability, self.committer.needed)
        return durability

    def restore(self, newer_than: int | None = None, floor: Floor | None = None) -> tuple[Restored | None, list[str]]:
        return self.restorer.restore(newer_than=newer_than, floor=floor)


def node_place(ranks: Ranks, topo: Topology, node: str, state: TrainingState) -> NodeExchange:
    """This rank's place in the node-local tier (what its parts share)."""
    return NodeExchange(ranks, topo, node, state)
