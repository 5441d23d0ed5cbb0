"""The agent's progress record: where this rank is. :class:`~.agent.CheckpointAgent` is its
only writer, from what its collaborators return."""

from __future__ import annotations

from dataclasses import dataclass

from ._restore import Restored


@dataclass
class Progress:
    """Where this rank is."""

    step: int = 0
    last_committed_step: int | None = None
    restored: Restored | None = None  # what restore() (or the framework) resumed from
    restore_ended: float | None = None  # wall clock: the resume span starts there
    resumed_reported: bool = False
    paused_s: float = 0.0
    paused_step: int | None = None  # training waits at this step boundary (heartbeats say so)
    boundary_at: float = 0.0  # under `powerguard try`: the last step boundary's monotonic time (its pace)
