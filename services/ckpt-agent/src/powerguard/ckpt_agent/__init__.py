"""PowerGuard ckpt-agent: consistent, durable, two-tier PyTorch checkpoints inside every
training rank, taken at one step on a power event and acked over NATS.

Flat public API::

    from powerguard.ckpt_agent import CheckpointAgent, verify_checkpoint
"""

from ._acks import Saved
from .agent import CheckpointAgent
from .errors import CheckpointError, CommitError, CorruptCheckpoint, NoRestorableCheckpoint, StepAgreementTimeout
from .verify import verify_checkpoint

__all__ = [
    "CheckpointAgent",
    "CheckpointError",
    "CommitError",
    "CorruptCheckpoint",
    "NoRestorableCheckpoint",
    "Saved",
    "StepAgreementTimeout",
    "verify_checkpoint",
]
