"""The coordinator (or another service with its flags) as a real process (``python -m powerguard.coordinator``),
its log lines parsed."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path


class CoordinatorProcess:
    module = "powerguard.coordinator"  # a service of the same flags: set by a subclass

    def __init__(self, config: Path, url: str, instance: str) -> None:
        self.config, self.url, self.instance = config, url, instance
        self.proc: asyncio.subprocess.Process | None = None
        self.lines: list[dict] = []
        self._reader: asyncio.Task | None = None

    async def start(self) -> CoordinatorProcess:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            self.module,
            "--config",
            str(self.config),
            "--nats-url",
            self.url,
            "--instance",
            self.instance,
            "--http-port",
            "0",
            "--log-level",
            "INFO",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        self._reader = asyncio.create_task(self._read())
        return self

    async def _read(self) -> None:
        assert self.proc and self.proc.stderr
        async for raw in self.proc.stderr:
            try:
                self.lines.append(json.loads(raw))
            except ValueError:
                self.lines.append({"msg": raw.decode(errors="replace")})

    def said(self, text: str) -> bool:
        return any(text in line.get("msg", "") for line in self.lines)

    async def kill(self) -> None:
        if self.proc and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)
            await self.proc.wait()

    async def stop(self) -> int:
        if self.proc and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(self.proc.wait(), 20)
        if self._reader:
            await asyncio.wait_for(self._reader, 5)
        return self.proc.returncode if self.proc else 0
