"""ckpt-agent errors: one root, precise subclasses; messages name the rank."""

from __future__ import annotations

from powerguard.schemas.errors import PowerGuardError


class CheckpointError(PowerGuardError):
    """Root of every ckpt-agent error."""


class CommitError(CheckpointError):
    """A checkpoint was written but could not be committed on every rank."""


class TierNotShared(CheckpointError):
    """``local_scope="shared"``, but not every rank sees the same directory (a mount missing on a
    node): no checkpoint may claim the shared tier."""


class CorruptCheckpoint(CheckpointError):
    """A committed checkpoint does not match its manifest (size or checksum)."""


class OtherWorldSize(CheckpointError):
    """A committed checkpoint that verifies was written by another number of ranks."""


class StepAgreementTimeout(CheckpointError):
    """Not every rank reached the step boundary in time (a rank is hung or gone)."""


class NoRestorableCheckpoint(CheckpointError):
    """Committed checkpoints exist but none can be restored (another world size without
    ``reshard``, every one corrupt, signed with another key): training from step 0 over them
    would silently lose the job's training, so ``restore()`` raises unless
    ``allow_fresh_start=True``."""


class NotCommittedAnywhere(CheckpointError):
    """A node-local step that no node holds a COMMIT of (a save cut before its commit): not a
    candidate, and nothing to report as refused."""


class IncompleteOnNodes(CheckpointError):
    """A node-local step some node committed that cannot be made whole on every node (a file
    on no node, a peer's copy that does not verify)."""


class NotAllHere(CheckpointError):
    """A copy to the remote tier found a file the checkpoint names missing from the local
    directory (on the node-local tier: a replica not yet arrived). Tried again later, and never
    committed without it."""
