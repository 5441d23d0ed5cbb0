"""The ``powerguard`` CLI and the service entry points, run as real processes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from powerguard.bus import EmbeddedNats
from powerguard.schemas import OnBattery, PowerData, registry
from powerguard.schemas.export import kv_values

pytestmark = pytest.mark.integration
BIN = Path(sys.executable).parent


async def _readline_until(stream: asyncio.StreamReader, needle: str, timeout: float = 20) -> str:
    async def scan() -> str:
        while True:
            line = (await stream.readline()).decode()
            if not line:
                raise AssertionError(f"stream ended before {needle!r}")
            if needle in line:
                return line

    return await asyncio.wait_for(scan(), timeout)


async def test_tail_prints_one_json_event_and_exits(bus, nats_server):
    proc = await asyncio.create_subprocess_exec(
        str(BIN / "powerguard"),
        "tail",
        "--count",
        "1",
        "--json",
        "--url",
        nats_server.url,
        "--prefix",
        bus.names.prefix,
        "--stream",
        bus.names.stream,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    await _readline_until(proc.stderr, "listening")
    event = OnBattery(data=PowerData(site="dc1", ups="ups-a", on_battery=True, runtime_s=123.0))
    await bus.publish(event)
    stdout, _ = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode == 0
    lines = stdout.decode().splitlines()
    assert len(lines) == 1
    line = json.loads(lines[0])
    assert line["event"]["id"] == event.id and line["event"]["type"] == event.type
    assert line["subject"] == bus.subjects.power("dc1", "ups-a")
    assert line["event"]["data"]["runtime_s"] == 123.0
    assert len(line["trace_id"]) == 32


def test_schemas_export_writes_asyncapi_and_one_schema_per_type(tmp_path):
    out = subprocess.run(
        [str(BIN / "powerguard"), "schemas", "export", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "asyncapi.yaml").read_text().startswith("asyncapi: 3.0.0")
    assert len(list(tmp_path.glob("*.schema.json"))) == len(registry()) + len(kv_values())  # + the status's


def test_help_everywhere():
    for args in (["--help"], ["tail", "--help"], ["nats", "--help"], ["schemas", "export", "--help"]):
        out = subprocess.run([str(BIN / "powerguard"), *args], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and "Usage" in out.stdout


def test_embedded_server_starts_on_a_free_port_and_stops_by_pid(tmp_path):
    server = EmbeddedNats(store_dir=tmp_path).start()
    pid = server.pid
    assert server.port and server.url.startswith("nats://127.0.0.1:")
    os.kill(pid, 0)
    server.stop()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


@pytest.mark.parametrize("service", ["ups_monitor", "coordinator", "power_control"])
async def test_service_starts_reports_ready_and_drains_on_sigterm(service, nats_server, tmp_path):
    site = tmp_path / "site.yaml"
    site.write_text("site: dc1\nups: [{name: ups-a, driver: nut}]\nnodes: [{name: n1, feeds: [ups-a]}]\n")
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        f"powerguard.{service}",
        "--nats-url",
        nats_server.url,
        "--http-port",
        "0",
        "--config",
        str(site),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        line = json.loads(await _readline_until(proc.stderr, "health and metrics on"))
        base = line["msg"].rsplit(" ", 1)[1]
        await _readline_until(proc.stderr, "ready")

        def get(path: str) -> tuple[int, str]:
            try:
                with urllib.request.urlopen(base + path, timeout=5) as r:
                    return r.status, r.read().decode()
            except urllib.error.HTTPError as exc:
                return exc.code, exc.read().decode()

        assert (await asyncio.to_thread(get, "/healthz"))[0] == 200
        status, body = await asyncio.to_thread(get, "/readyz")
        if service == "ups_monitor":  # nothing answers at the UPS's address: alive, not ready, and why
            assert status == 503 and json.loads(body)["ready"] is False
            assert "ups ups-a: " in json.loads(body)["reason"], body
        else:
            assert status == 200 and json.loads(body)["ready"] is True
        status, metrics = await asyncio.to_thread(get, "/metrics")
        assert status == 200 and "python_info" in metrics
        proc.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(proc.communicate(), 20)
        assert proc.returncode == 0
        assert b"stopped" in stderr
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def test_service_rejects_an_invalid_site_file(tmp_path):
    site = tmp_path / "site.yaml"
    site.write_text("site: dc1\nnodes: [{name: n1, feeds: [nope]}]\n")
    out = subprocess.run(
        [sys.executable, "-m", "powerguard.coordinator", "--config", str(site)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "feed 'nope' is not a configured UPS" in out.stderr


async def test_tail_on_a_server_without_the_stream_says_so(tmp_path):
    with EmbeddedNats(store_dir=tmp_path) as server:
        proc = await asyncio.create_subprocess_exec(
            str(BIN / "powerguard"),
            "tail",
            "--url",
            server.url,
            "--count",
            "1",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        _, stderr = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 1
    assert "stream PG_EVENTS does not exist yet" in stderr.decode()


def test_the_ckpt_agent_module_is_the_offline_verify_command_not_a_service():
    r = subprocess.run(
        [sys.executable, "-m", "powerguard.ckpt_agent", "--help"], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0 and "verify" in r.stdout
