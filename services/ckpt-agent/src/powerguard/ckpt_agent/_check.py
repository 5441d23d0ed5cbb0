"""Resume-check mode, set by the environment so a user's script runs unchanged under
``powerguard check-resume``: the checkpoints go to the check's own directory (no bus, no
remote tier), the run stops right after a checkpoint at a given step, and a run's last step is
checkpointed at ``close()`` so two runs can be compared tensor by tensor (``_compare``)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

DIR, STOP_AT, FINAL = "POWERGUARD_CHECK_DIR", "POWERGUARD_CHECK_STOP_AT", "POWERGUARD_CHECK_FINAL"


@dataclass(frozen=True)
class CheckMode:
    directory: str | None = None  # the checkpoints' root instead of local_dir
    stop_at: int | None = None  # checkpoint this step, then exit (SystemExit 0, every rank)
    final: bool = False  # checkpoint the last step at close()

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> CheckMode:
        stop = env.get(STOP_AT, "")
        if stop and not stop.isdigit():
            raise ValueError(f"{STOP_AT}={stop!r}: a step number")
        return cls(env.get(DIR) or None, int(stop) if stop else None, env.get(FINAL, "") == "1")

    @property
    def on(self) -> bool:
        return self.directory is not None
