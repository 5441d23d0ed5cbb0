"""The local tier's interface, and the shared tier behind it (the node-local one is in
``_node_tier``). A save writes every rank's files and manifest into the step directory and
gathers what each rank wrote (:class:`Written`); the tier commits it: writes ``COMMIT``
where it belongs and says how durable the checkpoint is, or raises :class:`CommitError`.
"""

from __future__ import annotations

import logging
import os
import secrets
from typing import Any, NamedTuple, Protocol

from . import _layout as L
from ._ranks import Ranks
from ._retainer import Retainer
from .errors import CommitError, TierNotShared

log = logging.getLogger("powerguard.ckpt_agent")


class Written(NamedTuple):
    """What one rank wrote into a step directory (gathered on every rank)."""

    rank: int
    ok: bool
    digest: str  # of its manifest
    error: str | None
    keyed: str | None  # the manifest's keyed digest (with a site key)
    body: bytes | None = None  # the manifest itself (node tier: every node stores every manifest)
    meta: bytes | None = None  # rank 0's ``.metadata`` (node tier)


def commit_written(
    fs: Any,
    directory: str,
    *,
    job: str,
    tier: str,
    step: int,
    world_size: int,
    written: list[Written],
    meta: bytes,
    key: bytes | None,
    extra: dict | None,
) -> None:
    """``COMMIT`` over every rank's manifest and the metadata (keyed with the job's key)."""
    L.write_commit(
        fs,
        directory,
        job=job,
        tier=tier,
        step=step,
        world_size=world_size,
        digests={w.rank: w.digest for w in written},
        metadata_digest=L.digest_bytes(meta),
        extra=extra,
        key=key,
        keyed_manifests={w.rank: w.keyed for w in written} if key is not None else None,
        metadata=meta,
    )


class Tier(Protocol):
    bodies: bool  # the tier needs every manifest and the metadata gathered

    @property
    def leader(self) -> bool:
        """This rank prepares the step directory (and commits it)."""
        ...

    def commit(self, directory: str, step: int, written: list[Written], *, saga_id: str | None) -> str:
        """Write ``COMMIT``; the checkpoint's durability (``local``, ``replicated:k``)."""
        ...

    def ready(self) -> None:
        """Every rank, before a save (collective): whatever the tier must establish first."""
        ...

    def check(self) -> str | None:
        """Before a save, on every rank: what makes this rank unfit to claim the tier, or None."""
        ...


class SharedTier:
    """One directory every rank of the job sees: rank 0 prepares it, writes ``COMMIT`` over
    every rank's manifest, and prunes old checkpoints in the background."""

    bodies = False
    PROBE = ".shared-probe"

    def __init__(
        self, ranks: Ranks, fs: Any, *, job: str, key: bytes | None, retainer: Retainer, root: str, node: str = ""
    ) -> None:
        self.ranks, self.fs, self.job, self.key, self.retainer = ranks, fs, job, key, retainer
        self.root, self.node = root, node
        self.nonce: str | None = None
        self.unproven: str | None = "not proven shared yet"  # why not, while it is not

    @property
    def probe(self) -> str:
        return os.path.join(self.root, self.job, self.PROBE)

    def prove(self) -> None:
        """Every rank: rank 0 writes a fresh nonce (fsynced) under the job's directory and every
        rank reads it back from its own ``local_dir``. Raises :class:`TierNotShared` naming each
        rank that does not see it, its node and its path. A nonce rank 0 cannot write (the disk,
        not the sharing) leaves the tier unproven: each save fails with that reason and tries
        again (:meth:`ready`); training goes on."""
        rank, problem = self.ranks.rank, None
        nonce = None
        if rank == 0:
            try:
                L.makedirs_durable(os.path.dirname(self.probe))
                candidate = secrets.token_hex(16)
                L.write_durable(self.fs, self.probe, candidate.encode())
                nonce = candidate
            except OSError as exc:
                problem = f"rank 0 (node {self.node}) cannot write {self.probe}: {exc}"
        # also the barrier: rank 0 wrote it before anyone reads
        self.nonce, self.unproven = self.ranks.gather((nonce, problem))[0]
        if self.nonce is None:
            log.warning("rank %d: the shared tier is not proven shared yet: %s", rank, self.unproven)
            return
        if problems := [p for p in self.ranks.gather(self.check()) if p]:
            raise TierNotShared(
                f"local_scope='shared' but the ranks do not share one directory: {'; '.join(problems)}. "
                "Mount the shared directory at local_dir on every node, or use local_scope='node' for "
                "node-local disks"
            )

    def ready(self) -> None:
        """Every rank, before a save: a tier not yet proven shared is proven now."""
        if self.nonce is None:
            self.prove()

    def check(self) -> str | None:
        """This rank still reads rank 0's nonce from its ``local_dir`` (a mount lost since the
        start fails here, before any save claims the tier)."""
        if self.nonce is None:
            return self.unproven
        try:
            with open(self.probe, "rb") as f:
                seen = f.read().decode(errors="replace")
        except OSError as exc:
            return (
                f"rank {self.ranks.rank} (node {self.node}) does not see rank 0's {self.probe} ({exc.strerror or exc})"
            )
        if seen != self.nonce:
            return (
                f"rank {self.ranks.rank} (node {self.node}) reads another {self.probe} than rank 0 wrote "
                "(a directory of its own, not the shared one)"
            )
        return None

    @property
    def leader(self) -> bool:
        return self.ranks.rank == 0

    def commit(self, directory: str, step: int, written: list[Written], *, saga_id: str | None) -> str:
        committed = True
        if self.ranks.rank == 0:
            try:
                with open(os.path.join(directory, ".metadata"), "rb") as f:
                    meta = f.read()
                commit_written(
                    self.fs,
                    directory,
                    job=self.job,
                    tier="local",
                    step=step,
                    world_size=self.ranks.world_size,
                    written=written,
                    meta=meta,
                    key=self.key,
                    extra={"saga_id": saga_id} if saga_id else None,
                )
                self.retainer.start()
            except OSError as exc:
                log.error("rank 0: COMMIT of %s failed: %s", directory, exc)
                committed = False
        if not self.ranks.all_ok(committed):
            raise CommitError(f"rank 0 could not write COMMIT in {directory}")
        return "local"
