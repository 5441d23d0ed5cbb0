"""A secured deployment for the adversarial tests: a real nats-server loaded with the shipped
compose/nats.conf (or nats-tls.conf), credentials made by `powerguard creds init`, the stream
made by `powerguard bootstrap` (admin). Each test attacks with the credential that made the
attack possible before the fix and checks that the legitimate path still works."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from powerguard.bus import Bus, BusNames, EmbeddedNats, PublishError
from powerguard.bus import creds as creds_mod
from tests.integration.ups.nut_peer import free_port
from tests.waiting import eventually  # noqa: F401  (the suite's one wait helper, re-exported)

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose"
SITE = "dc1"
JOBS = ("jobA", "jobB")


@dataclass
class Deployment:
    server: EmbeddedNats
    creds: Path
    names: BusNames
    tls: Path | None = None
    buses: list[Bus] = field(default_factory=list)
    monitor_port: int | None = None  # the server's monitoring endpoint (varz: slow consumers)

    def varz(self) -> dict:
        """The server's own counters (``/varz``)."""
        import json
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.monitor_port}/varz", timeout=5) as r:
            return json.loads(r.read())

    @property
    def url(self) -> str:
        return self.server.url.replace("nats://", "tls://") if self.tls else self.server.url

    def creds_of(self, role: str, job: str | None = None, node: str | None = None) -> Path:
        if job and node:  # a job's credential for one node, made on first use
            path = self.creds / f"agent-{job}-{node}.creds"
            return path if path.exists() else creds_mod.issue(self.creds, "agent", job=job, node=node)
        return self.creds / (f"agent-{job}.creds" if job else f"{role}.creds")

    async def connect(self, role: str, *, job: str | None = None, node: str | None = None, **kw) -> Bus:
        tls = {"tls_ca": self.tls / "ca.pem"} if self.tls else {}
        bus = await Bus.connect(
            self.url,
            service=kw.pop("service", f"ckpt-agent-{job}" if job else role),
            names=self.names,
            creds_file=self.creds_of(role, job, node),
            setup=False,
            connect_timeout=5,
            **tls,
            **kw,
        )
        self.buses.append(bus)
        return bus

    async def close(self) -> None:
        for bus in reversed(self.buses):
            try:
                await bus.close()
            except Exception:
                pass
        self.server.stop()


def make_certs(directory: Path) -> Path:
    subprocess.run(["sh", str(COMPOSE / "make-certs.sh"), str(directory), "localhost"], check=True, capture_output=True)
    return directory


def start(tmp: Path, *, conf: str = "nats.conf", tls: Path | None = None, monkeypatch=None) -> Deployment:
    names = BusNames()
    auth = tmp / "auth"
    creds_mod.init(auth, names=names, sites=[SITE])
    for job in JOBS:
        creds_mod.issue(auth, "agent", job=job)
    for name in ("nats.conf", "nats-tls.conf", "nats-leafnodes.conf", "nats-leaf.conf"):
        shutil.copy(COMPOSE / name, tmp / name)
    if tls is not None:
        monkeypatch.setenv("NATS_TLS_CERT", str(tls / "server-cert.pem"))
        monkeypatch.setenv("NATS_TLS_KEY", str(tls / "server-key.pem"))
        monkeypatch.setenv("NATS_TLS_CA", str(tls / "ca.pem"))
    monitor = free_port()
    server = EmbeddedNats(store_dir=tmp / "store", extra_args=["-c", str(tmp / conf), "-m", str(monitor)])
    server.start()
    return Deployment(server=server, creds=auth, names=names, tls=tls, monitor_port=monitor)


@pytest.fixture
async def deployment(tmp_path, monkeypatch) -> AsyncIterator[Deployment]:
    dep = start(tmp_path)
    admin = await dep.connect("admin")
    await admin.bootstrap([SITE])
    try:
        yield dep
    finally:
        await dep.close()


async def refused(coro, timeout: float = 3.0) -> str:
    """The server refused the operation (a permissions violation surfaces as an error or a timeout)."""
    try:
        await asyncio.wait_for(coro, timeout)
    except (PublishError, TimeoutError, Exception) as exc:
        return f"{type(exc).__name__}: {exc}"
    raise AssertionError("the server allowed it")
