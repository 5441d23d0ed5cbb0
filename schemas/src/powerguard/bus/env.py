"""Settings every process reads from its environment the same way."""

from __future__ import annotations

import os
from pathlib import Path


def env_secret(name: str) -> str | None:
    """``NAME_FILE`` (a mounted secret, read and stripped) or ``NAME``; None when neither is set."""
    path = os.environ.get(f"{name}_FILE")
    return Path(path).read_text().strip() if path else os.environ.get(name)
