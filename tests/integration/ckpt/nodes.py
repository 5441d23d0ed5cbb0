"""A multi-node training job on one machine: one torchrun per simulated node (static rendezvous
on loopback), each in a mount namespace of its own where the node's disk is mounted at one
path (``<tmp>/nvme``) and the directory holding every node's disk is covered by an empty tmpfs:
a rank can read its own node's disk and no other (the launch fails if it could). Needs root."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
from pathlib import Path

import pytest

from powerguard.bus import free_ports

TORCHRUN = Path(sys.executable).parent / "torchrun"
ROOT = Path(__file__).resolve().parents[3]


def require_namespaces() -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        if os.environ.get("CI"):
            pytest.fail("node-local tier tests need root and unshare (mount namespaces)")
        pytest.skip("node-local tier tests need root and unshare (mount namespaces)")


class Cluster:
    """``nodes`` simulated nodes of ``ranks_per_node`` ranks; ``disk(node)`` is that node's NVMe."""

    def __init__(self, tmp: Path, job: str, nodes: list[str], ranks_per_node: int = 1) -> None:
        self.tmp, self.job, self.nodes, self.rpn = tmp, job, nodes, ranks_per_node
        self.disks = tmp / "disks"
        self.mount = tmp / "nvme"
        self.runs = 0

    def disk(self, node: str) -> Path:
        return self.disks / node

    async def run(
        self,
        *,
        steps: int,
        timeout: float = 240,
        nodes: list[str] | None = None,
        fails: bool = False,
        env: dict[str, str] | None = None,
        **options,
    ) -> str:
        """Run the job to ``steps`` on ``nodes`` (default: the cluster's); returns every node's log
        (``fails``: every node's job must exit non-zero; ``env``: more environment, a
        ``POWERGUARD_TEST_FAILPOINT`` runs the job through :mod:`.failpoints`)."""
        env = dict(env or {})
        module = "powerguard.sim.train"
        if "POWERGUARD_TEST_FAILPOINT" in env:  # the wrapper module lives in the repository
            module = "tests.integration.ckpt.failpoints"
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        nodes = nodes or self.nodes
        self.runs += 1
        self.mount.mkdir(parents=True, exist_ok=True)
        port = free_ports(1)[0]
        args = ["--job", self.job, "--steps", str(steps), "--local-dir", str(self.mount), "--local-scope", "node"]
        args += ["--out", str(self.tmp / f"final-{self.runs}.pt")]
        for key, value in options.items():
            flag = f"--{key.replace('_', '-')}"
            args += [flag] if value is True else [flag, str(value)]
        procs, logs = [], []
        hide = (
            f'mount --bind "{{disk}}" "{self.mount}" && mount -t tmpfs -o size=1m pg-other-nodes "{self.disks}" '
            f'&& test -z "$(ls -A "{self.disks}")" && exec "$@"'
        )
        for i, node in enumerate(nodes):
            self.disk(node).mkdir(parents=True, exist_ok=True)
            log = self.tmp / f"run{self.runs}-{node}.log"
            logs.append(log)
            launch = [
                str(TORCHRUN),
                "--nnodes",
                str(len(nodes)),
                "--node-rank",
                str(i),
                "--nproc-per-node",
                str(self.rpn),
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                str(port),
                "-m",
                module,
                *args,
            ]
            with open(log, "wb") as out:
                procs.append(
                    await asyncio.create_subprocess_exec(
                        "unshare",
                        "--mount",
                        "--propagation",
                        "private",
                        "sh",
                        "-c",
                        hide.replace("{disk}", str(self.disk(node))),
                        "sh",
                        *launch,
                        stdout=out,
                        stderr=asyncio.subprocess.STDOUT,
                        env={**os.environ, "OMP_NUM_THREADS": "1", "POWERGUARD_NODE": node, **env},
                        start_new_session=True,
                    )
                )
        try:
            codes = await asyncio.wait_for(asyncio.gather(*(p.wait() for p in procs)), timeout)
        finally:
            for p in procs:
                if p.returncode is None:
                    p.kill()
                    await p.wait()
        text = "\n".join(f"==== {n}\n{log.read_text(errors='replace')}" for n, log in zip(nodes, logs, strict=True))
        if fails:
            assert all(codes), f"a node's job did not fail ({codes}):\n{text[-6000:]}"
        else:
            assert codes == [0] * len(nodes), f"a node's job failed ({codes}):\n{text[-6000:]}"
        return text

    def final(self) -> Path:
        return self.tmp / f"final-{self.runs}.pt"
