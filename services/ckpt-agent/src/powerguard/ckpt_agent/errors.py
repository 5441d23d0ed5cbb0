"""ckpt-agent errors: one root, precise subclasses; messages name the rank."""

from __future__ import annotations

from powerguard.schemas.errors import PowerGuardError


class CheckpointError(PowerGuardError):
    """Root of every ckpt-agent error."""


class CommitError(CheckpointError):
    """A checkpoint was written but could not be committed on every rank."""


class CorruptCheckpoint(CheckpointError):
    """A committed checkpoint does not match its manifest (size or checksum)."""


class StepAgreementTimeout(CheckpointError):
    """Not every rank reached the step boundary in time (a rank is hung or gone)."""
