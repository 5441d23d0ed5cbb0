"""The local tier's interface, and the shared tier behind it (the node-local one is in
``_node_tier``). A save writes every rank's files and manifest into the step directory and
gathers what each rank wrote (:class:`Written`); the tier commits it: writes ``COMMIT``
where it belongs and says how durable the checkpoint is, or raises :class:`CommitError`.
"""

from __future__ import annotations

import logging
import os
from typing import Any, NamedTuple, Protocol

from . import _layout as L
from ._ranks import Ranks
from ._retainer import Retainer
from .errors import CommitError

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


class SharedTier:
    """One directory every rank of the job sees: rank 0 prepares it, writes ``COMMIT`` over
    every rank's manifest, and prunes old checkpoints in the background."""

    bodies = False

    def __init__(self, ranks: Ranks, fs: Any, *, job: str, key: bytes | None, retainer: Retainer) -> None:
        self.ranks, self.fs, self.job, self.key, self.retainer = ranks, fs, job, key, retainer

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
