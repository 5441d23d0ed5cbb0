"""The node-local tier's replication: after the commit, each node leader sends its own ranks'
data files to the ``replicas`` nodes after it, in the background, one checkpoint after another;
once the copies land the acks are raised (``on_replicated``). A job with a remote tier then
gathers on the first node (rank 0's, whose copier uploads the checkpoint under one ``COMMIT``)
every file it does not hold yet: with a sharded job on three or more nodes no ring replica
brings it all."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable

from ._node_exchange import NodeExchange
from ._nodes import confirm, exchange, node_files
from ._tiers import Written

log = logging.getLogger("powerguard.ckpt_agent")

OnReplicated = Callable[[int, list[tuple[int, str, int]], str, str], None]


class Replicator:
    def __init__(
        self,
        ex: NodeExchange,
        *,
        replicas: int,
        key: bytes | None,
        on_replicated: OnReplicated | None = None,
        gather: bool = False,
    ) -> None:
        self.ex, self.replicas, self.key = ex, replicas, key
        self.gather = gather  # the job has a remote tier: rank 0's node gathers every file for its copy
        # (step, [(rank, manifest digest, bytes) of this node's ranks], level, directory) once this
        # node's files are on its peers and that raises their durability (the acks say so again)
        self.on_replicated = on_replicated
        self._thread: threading.Thread | None = None
        self.replicated: tuple[str, bool, list[str]] | None = None  # (directory, complete, problems), last one

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait until the last checkpoint's replication ended; True when it ended."""
        if self._thread is None:
            return True
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def start(
        self, directory: str, step: int, results: list[Written], committed: str, needed: dict[str, set[str]]
    ) -> None:
        """Send this node's own ranks' data files to the ``replicas`` nodes after it (those they
        do not hold already) and take those of the nodes before it; leaders only, on their own
        gloo group, one checkpoint after another. The local commit does not wait for it."""
        if not self.ex.ranks.distributed or not self.ex.leader or len(self.ex.topo.order) < 2:
            return
        if self.replicas < 1 and not self.gather:
            return
        manifests = {w.rank: json.loads(w.body)["files"] for w in results}
        previous = self._thread

        def run() -> None:
            if previous is not None:
                previous.join()
            t0 = time.perf_counter()
            problems: list[str] = []  # what this node received from the nodes before it
            holders: list[str] = []  # the nodes after it that confirmed they hold this node's files
            ring = self.ex.topo.order
            i = ring.index(self.ex.node)
            for j in range(1, min(self.replicas, len(ring) - 1) + 1):
                dst, src = ring[(i + j) % len(ring)], ring[(i - j) % len(ring)]
                out = node_files(self.ex.topo, self.ex.node, manifests)
                inc = node_files(self.ex.topo, src, manifests)
                group = self.ex.ranks.replica_group
                try:
                    got = exchange(
                        [
                            (os.path.join(directory, n), int(f["size"]))
                            for n, f in sorted(out.items())
                            if n not in needed[dst]
                        ],
                        self.ex.topo.leader(dst),
                        [
                            (os.path.join(directory, n), f)
                            for n, f in sorted(inc.items())
                            if n not in needed[self.ex.node]
                        ],
                        self.ex.topo.leader(src),
                        group,
                        key=self.key,
                    )
                    problems += got
                    # the receiver's word on this node's files, this node's word to its sender
                    if confirm(not got, self.ex.topo.leader(src), self.ex.topo.leader(dst), group):
                        holders.append(dst)
                    else:
                        log.error(
                            "rank %d: the copy of this node's files of %s not confirmed by node %s (it could not "
                            "verify what it received): no replica counted there",
                            self.ex.rank,
                            directory,
                            dst,
                        )
                except (RuntimeError, OSError) as exc:  # a peer gone: the local commit stands
                    problems.append(f"with nodes {dst}/{src}: {exc}")
                    break
            else:  # no peer gone: the remote copy's gathering needs every leader
                if self.gather:
                    problems += self._gather(directory, manifests, needed)
            k = len(holders)
            self.replicated = (directory, not problems and k == min(self.replicas, len(ring) - 1), problems)
            if problems:
                log.error("rank %d: replication of %s incomplete: %s", self.ex.rank, directory, "; ".join(problems))
            if k:
                took = time.perf_counter() - t0
                log.info(
                    "rank %d: %s replicated to %d peer node(s) in %.2fs (confirmed by %s)",
                    self.ex.rank,
                    directory,
                    k,
                    took,
                    ", ".join(holders),
                )
                if self.on_replicated is not None and _copies(committed) < k:  # the commit said less
                    mine = [w for w in results if self.ex.topo.nodes[w.rank] == self.ex.node]
                    sizes = {w.rank: sum(int(f["size"]) for f in manifests[w.rank].values()) for w in mine}
                    done = [(w.rank, w.digest, sizes[w.rank]) for w in mine]
                    self.on_replicated(step, done, f"replicated:{k}", directory)

        self._thread = threading.Thread(target=run, name="pg-ckpt-replicate", daemon=True)
        self._thread.start()

    def _gather(self, directory: str, manifests: dict[int, dict], needed: dict[str, set[str]]) -> list[str]:
        """Every node whose files the first node holds neither for its own restore (``needed``)
        nor as a ring replica sends them there, one node after another (the same plan on every
        leader, from the manifests): the remote copy on rank 0 then finds the whole checkpoint on
        its own disk. What arrives is verified and fsynced as a replica is; what does not, the
        copy names (``NotAllHere``) and never commits without."""
        topo, ring = self.ex.topo, self.ex.topo.order
        first, group = ring[0], self.ex.ranks.replica_group
        via_ring = {ring[-j] for j in range(1, min(self.replicas, len(ring) - 1) + 1)}
        problems: list[str] = []
        for src in ring[1:]:
            if src in via_ring:
                continue
            files = sorted((n, f) for n, f in node_files(topo, src, manifests).items() if n not in needed[first])
            if not files:
                continue
            try:
                if self.ex.node == first:
                    got = exchange(
                        [],
                        None,
                        [(os.path.join(directory, n), f) for n, f in files],
                        topo.leader(src),
                        group,
                        key=self.key,
                    )
                    problems += [f"gathering for the remote tier: {p}" for p in got]
                elif self.ex.node == src:
                    out = [(os.path.join(directory, n), int(f["size"])) for n, f in files]
                    exchange(out, topo.leader(first), [], None, group, key=self.key)
            except (RuntimeError, OSError) as exc:  # a peer gone: the copy will say what it lacks
                problems.append(f"gathering node {src}'s files on node {first}: {exc}")
                break
        if self.ex.node == first and not problems:
            log.info("rank %d: %s gathered whole on node %s for the remote tier", self.ex.rank, directory, first)
        return problems


def _copies(durability: str) -> int:
    """Peer copies a durability level says: ``local`` 0, ``replicated:k`` k."""
    head, _, k = durability.partition(":")
    return int(k) if head == "replicated" and k.isdigit() else 0
