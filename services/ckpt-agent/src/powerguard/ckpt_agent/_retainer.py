"""Old checkpoints deleted off the critical path: one background pass at a time (rank 0 on a
shared tier, each node's leader on the node tier); a commit during a pass is caught up by the
next one."""

from __future__ import annotations

import logging
import threading
from typing import Any

from . import _layout as L

log = logging.getLogger("powerguard.ckpt_agent")


class Retainer:
    def __init__(self, fs: Any, root: str, job: str, keep: int) -> None:
        self.fs, self.root, self.job, self.keep = fs, root, job, keep
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return  # the next commit will catch up

        def run() -> None:
            try:
                L.retain(self.fs, self.root, self.job, self.keep)
            except OSError as exc:
                log.warning("retention in %s failed: %s", self.root, exc)

        self._thread = threading.Thread(target=run, name="pg-ckpt-retain", daemon=True)
        self._thread.start()

    def join(self, timeout_s: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout_s)
