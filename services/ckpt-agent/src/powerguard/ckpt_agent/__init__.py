"""PowerGuard ckpt-agent: consistent, durable, two-tier PyTorch checkpoints inside every
training rank, taken at one step on a power event and acked over NATS.

Flat public API::

    from powerguard.ckpt_agent import CheckpointAgent, verify_checkpoint
"""

from typing import TYPE_CHECKING

from .errors import CheckpointError, CommitError, CorruptCheckpoint, NoRestorableCheckpoint, StepAgreementTimeout

if TYPE_CHECKING:
    from ._acks import Saved
    from .agent import CheckpointAgent
    from .verify import verify_checkpoint

_LAZY = {"CheckpointAgent": ".agent", "Saved": "._acks", "verify_checkpoint": ".verify"}


def __getattr__(name: str):
    """The agent (and torch) are imported on first use: a tool that reads only the package's light
    modules (the site file's section model, the layout, the S3 store) never pays for torch."""
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
