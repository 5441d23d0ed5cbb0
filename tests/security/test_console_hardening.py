"""Threat: the operator console, served without a token (the default, on loopback), read by a
web page through DNS rebinding (the page's own host name pointed at 127.0.0.1), and a
malformed credential answered with a 500 instead of a 401. Against the real console server."""

from __future__ import annotations

import base64

import aiohttp

from powerguard.bus import EmbeddedNats
from powerguard.cli.console import start_console


async def test_12_a_rebinding_host_or_a_foreign_origin_is_refused_and_loopback_still_reads(tmp_path):
    server = EmbeddedNats(store_dir=tmp_path / "nats")
    server.start()
    stop, url = await start_console(url=server.url, site=None, port=0, allowed_hosts=("console.example",))
    port = url.rstrip("/").rsplit(":", 1)[1]
    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(url + "api/state", headers={"Host": f"attacker.example:{port}"}) as r:
                assert r.status == 421 and "attacker.example" in await r.text()
            origin = {"Origin": "http://attacker.example"}
            async with s.get(url + "api/state", headers=origin) as r:
                assert r.status == 421
            async with s.get(url + "api/state") as r:  # 127.0.0.1: the legitimate read
                assert r.status == 200 and "ups" in await r.json()
            for host in (f"localhost:{port}", f"console.example:{port}"):
                async with s.get(url + "api/state", headers={"Host": host, "Origin": f"http://{host}"}) as r:
                    assert r.status == 200, host
            async with s.get(url + "healthz", headers={"Host": "anything"}) as r:
                assert r.status == 200  # the health check of a container names no host
    finally:
        await stop()
        server.stop()


async def test_12_any_malformed_credential_is_a_401(tmp_path):
    server = EmbeddedNats(store_dir=tmp_path / "nats")
    server.start()
    stop, url = await start_console(url=server.url, site=None, port=0, token="s3cret")
    bad = [
        "Bearer s3crét",  # non-ASCII
        "Bearer \u2603",
        "Basic !!!not-base64",
        "Basic " + base64.b64encode(b"\xff\xfe:\xff").decode(),  # not UTF-8
        "Basic " + base64.b64encode("ops:s3crét".encode()).decode(),
        "Digest x",
    ]
    try:
        async with aiohttp.ClientSession() as s:
            for header in bad:
                async with s.get(url + "api/state", headers={"Authorization": header.encode().decode("latin-1")}) as r:
                    assert r.status == 401, header
            async with s.get(url + "api/state", headers={"Authorization": "Bearer s3cret"}) as r:
                assert r.status == 200
    finally:
        await stop()
        server.stop()
