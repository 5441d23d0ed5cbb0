"""Alerting around a simulated site: Debian's ``prometheus`` and ``prometheus-alertmanager``
scraping the site's real services and the JetStream health exporter with the shipped rules and
Alertmanager config, and a webhook receiver standing in for the pager. Used by the end-to-end
alerting test and ``bench/alerting.py`` (alert-to-page latency).

What differs from the shipped configuration, and only for speed: scrape and evaluation every
second, Alertmanager's ``group_wait`` 1 s, and every rule's ``for:`` shortened to ``FOR_S``
(a drill lasts a minute, not an afternoon); targets are the site's loopback ports.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from powerguard.bus.embedded import with_parent

COMPOSE = Path(__file__).resolve().parents[3] / "compose"
FOR_S = 3
_PORT_LINE = re.compile(r"health and metrics on http://127\.0\.0\.1:(\d+)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def service_port(log: Path, timeout_s: float = 30.0) -> int:
    """The metrics port a service logged at its start (it was started with ``--http-port 0``)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        m = _PORT_LINE.search(log.read_text(errors="replace")) if log.exists() else None
        if m:
            return int(m.group(1))
        time.sleep(0.1)
    raise TimeoutError(f"{log} names no metrics port")


@dataclass
class Page:
    """One alert as the webhook received it."""

    at: float
    status: str  # firing | resolved
    name: str
    labels: dict[str, str]


@dataclass
class Pager:
    """The webhook receiver: what Alertmanager delivered, in order."""

    pages: list[Page] = field(default_factory=list)
    _runner: web.AppRunner | None = None
    url: str = ""

    async def start(self) -> str:
        async def receive(request: web.Request) -> web.Response:
            body = await request.json()
            now = time.time()
            for a in body.get("alerts", []):
                self.pages.append(Page(now, a["status"], a["labels"].get("alertname", ""), a["labels"]))
            return web.Response(text="ok")

        app = web.Application()
        app.router.add_post("/{path:.*}", receive)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        port = _free_port()
        await web.TCPSite(self._runner, "127.0.0.1", port).start()
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def first(self, name: str, status: str = "firing", **labels: str) -> Page | None:
        return next(
            (
                p
                for p in self.pages
                if p.name == name and p.status == status and all(p.labels.get(k) == v for k, v in labels.items())
            ),
            None,
        )

    async def wait(self, name: str, status: str = "firing", timeout_s: float = 60.0, **labels: str) -> Page:
        deadline = time.monotonic() + timeout_s
        while (page := self.first(name, status, **labels)) is None:
            if time.monotonic() > deadline:
                seen = sorted({(p.name, p.status) for p in self.pages})
                raise TimeoutError(f"no {status} {name} {labels} within {timeout_s:.0f}s; the pager got {seen}")
            await asyncio.sleep(0.1)
        return page


def _fast_rules(src: Path, dst: Path) -> None:
    text = re.sub(r"^(\s*)for: \S+$", rf"\1for: {FOR_S}s", src.read_text(), flags=re.M)
    dst.write_text(text)


class Alerting:
    """Prometheus + Alertmanager for one site's loopback targets (``{job name: port}``)."""

    def __init__(self, workdir: Path, targets: dict[str, int], pager_url: str) -> None:
        self.workdir, self.targets, self.pager_url = workdir, targets, pager_url
        self.procs: list[subprocess.Popen] = []
        self.prometheus_port = self.alertmanager_port = 0

    def start(self) -> None:
        prom_bin = shutil.which("prometheus")
        am_bin = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
        if not prom_bin or not am_bin:
            raise FileNotFoundError("needs Debian's prometheus and prometheus-alertmanager")
        self.workdir.mkdir(parents=True, exist_ok=True)
        am = yaml.safe_load((COMPOSE / "alertmanager" / "alertmanager.yml").read_text())
        for r in am["receivers"]:
            for hook in r.get("webhook_configs", []):
                hook["url"] = self.pager_url + "/" + r["name"]
        am["route"]["group_wait"] = "1s"
        am["route"]["group_interval"] = "2s"
        for route in am["route"].get("routes", []):
            if "group_wait" in route:
                route["group_wait"] = "1s"
        (self.workdir / "alertmanager.yml").write_text(yaml.safe_dump(am))
        self.alertmanager_port = _free_port()
        self._spawn(
            "alertmanager",
            [
                am_bin,
                f"--config.file={self.workdir / 'alertmanager.yml'}",
                f"--storage.path={self.workdir / 'am-data'}",
                f"--web.listen-address=127.0.0.1:{self.alertmanager_port}",
                "--cluster.listen-address=",
            ],
        )
        _fast_rules(COMPOSE / "prometheus" / "alerts.yml", self.workdir / "alerts.yml")
        prom = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "900ms"},
            "rule_files": ["alerts.yml"],
            "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{self.alertmanager_port}"]}]}]},
            "scrape_configs": [
                {
                    "job_name": job,
                    "honor_labels": True,
                    "static_configs": [{"targets": [f"127.0.0.1:{port}"], "labels": {"site": "demo"}}],
                }
                for job, port in self.targets.items()
            ],
        }
        (self.workdir / "prometheus.yml").write_text(yaml.safe_dump(prom))
        self.prometheus_port = _free_port()
        self._spawn(
            "prometheus",
            [
                prom_bin,
                f"--config.file={self.workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.workdir / 'prom-data'}",
                f"--web.listen-address=127.0.0.1:{self.prometheus_port}",
            ],
        )

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.workdir / f"{name}.log", "wb")
        self.procs.append(
            subprocess.Popen(with_parent(argv), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        )
        log.close()

    def stop(self) -> None:
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError):
                p.terminate()
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


def start_exporter(site_file: Path, nats_url: str, log: Path) -> tuple[subprocess.Popen, int]:
    """The JetStream health exporter as its own process; returns it and its port."""
    port = _free_port()
    out = open(log, "wb")
    proc = subprocess.Popen(
        with_parent(
            [
                sys.executable,
                "-m",
                "powerguard.bus.health",
                "--config",
                str(site_file),
                "--nats-url",
                nats_url,
                "--http-port",
                str(port),
                "--every-s",
                "1",
            ]
        ),
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    out.close()
    return proc, port


def summary(pages: list[Page]) -> list[dict[str, Any]]:
    return [{"at": p.at, "status": p.status, "alert": p.name, "labels": p.labels} for p in pages]


def dump(pages: list[Page], path: Path) -> None:
    path.write_text(json.dumps(summary(pages), indent=2) + "\n")
