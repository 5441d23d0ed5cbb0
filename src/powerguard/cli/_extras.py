"""The commands that train (demo, try, check-resume) need the training side (torch and the
ckpt-agent); a management host installs PowerGuard without it. Say so instead of a traceback."""

from __future__ import annotations

import importlib.util

import typer
from rich.console import Console


def require_agent(command: str) -> None:
    missing = [m for m in ("torch", "powerguard.ckpt_agent") if _absent(m)]
    if missing:
        Console(stderr=True).print(
            f"error: `powerguard {command}` trains a job and needs {' and '.join(missing)} on this host: "
            "pip install 'powerguard[agent]' (a management host running the services does not need it)",
            highlight=False,
        )
        raise typer.Exit(2)


def _absent(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is None
    except ModuleNotFoundError:
        return True
