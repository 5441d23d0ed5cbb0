"""Launch the sample training job (powerguard.sim.train) with torchrun, 2 ranks, gloo on CPU."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import psutil

TORCHRUN = Path(sys.executable).parent / "torchrun"
ROOT = Path(__file__).resolve().parents[3]


class Trainer:
    def __init__(
        self,
        tmp: Path,
        job: str,
        *,
        nats_url: str | None = None,
        names=None,
        env: dict | None = None,
        module: str = "powerguard.sim.train",
        nproc: int = 2,
        **options,
    ) -> None:
        self.tmp, self.job, self.module, self.nproc = tmp, job, module, nproc
        self.args = ["--job", job, "--local-dir", str(tmp / "local")]
        if nats_url:
            self.args += [
                "--nats-url",
                nats_url,
                "--prefix",
                names.prefix,
                "--stream",
                names.stream,
                "--agents-bucket",
                names.agents,
            ]
        for key, value in options.items():
            flag = f"--{key.replace('_', '-')}"
            self.args += [flag] if value is True else [flag, str(value)]  # True: a switch
        self.env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
        if "POWERGUARD_TEST_FAILPOINT" in self.env:  # the wrapper module lives in the repository
            self.env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), self.env.get("PYTHONPATH")]))
        self.proc: asyncio.subprocess.Process | None = None
        self.log = tmp / f"{job}-{os.getpid()}-{id(self)}.log"

    async def start(self) -> Trainer:
        self.tmp.mkdir(parents=True, exist_ok=True)
        out = open(self.log, "wb")
        self.proc = await asyncio.create_subprocess_exec(
            str(TORCHRUN),
            "--standalone",
            "--nproc-per-node",
            str(self.nproc),
            "-m",
            # crash tests run the job through a wrapper that installs the failpoint
            "tests.integration.ckpt.failpoints" if "POWERGUARD_TEST_FAILPOINT" in self.env else self.module,
            *self.args,
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
            env=self.env,
            start_new_session=True,
        )
        out.close()
        return self

    async def wait(self, timeout: float = 120) -> int:
        assert self.proc
        return await asyncio.wait_for(self.proc.wait(), timeout)

    async def kill(self) -> None:
        """SIGKILL the launcher and both ranks at once (a power cut, as far as they can tell).
        torchrun puts its workers in sessions of their own, so the process tree is walked."""
        if self.proc is None:
            return
        try:
            victims = [psutil.Process(self.proc.pid), *psutil.Process(self.proc.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            victims = []
        for p in victims:
            try:
                p.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
        await self.proc.wait()

    def output(self) -> str:
        return self.log.read_text(errors="replace")


async def run(tmp: Path, job: str, timeout: float = 180, **kw) -> Trainer:
    t = await Trainer(tmp, job, **kw).start()
    code = await t.wait(timeout)
    assert code == 0, f"training exited {code}:\n{t.output()[-4000:]}"
    return t
