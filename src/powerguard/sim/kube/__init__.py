"""A simulated Kubernetes API server (``python -m powerguard.sim.kube``): the real protocol's
semantics for what PowerGuard's Kubernetes adapter uses, with controllers and kubelets that run
pods as real processes. See ``__main__.py``."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path


def server_argv(
    port: int,
    directory: Path,
    nodes: Mapping[str, Path | None],
    *,
    roles: Mapping[str, Path],
    labels: Mapping[str, str] | None = None,
    history: int | None = None,
) -> list[str]:
    """The command line of the simulated API server (``python -m powerguard.sim.kube``)."""
    argv = [sys.executable, "-m", "powerguard.sim.kube", "--port", str(port), "--dir", str(directory)]
    for user, manifest in roles.items():
        argv += ["--role", f"{user}={manifest}"]
    for name, state in nodes.items():
        argv += ["--node", f"{name}={state}" if state else name]
    for k, v in (labels or {}).items():
        argv += ["--node-label", f"{k}={v}"]
    if history is not None:
        argv += ["--history", str(history)]
    return argv
