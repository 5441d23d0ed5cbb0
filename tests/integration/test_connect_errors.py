"""A failed connect says why in one line, quietly: the credential file missing or garbage (named
before anything connects), nothing listening (after a bounded retry with no warning per try), a
credential the server does not trust."""

from __future__ import annotations

import logging

import pytest

from powerguard.bus import Bus, BusNames, ConnectError
from powerguard.bus import creds as creds_mod
from tests.integration.ups.nut_peer import free_port
from tests.security.conftest import start


async def test_nats_down_is_one_quiet_line_naming_the_refusal(caplog):
    caplog.set_level(logging.DEBUG)
    url = f"nats://127.0.0.1:{free_port()}"
    with pytest.raises(ConnectError) as exc:
        await Bus.connect(url, service="x", setup=False, connect_timeout=1.5)
    assert str(exc.value) == (
        f"cannot connect to NATS at {url} (tried for 1.5s): connection refused: "
        "is nats-server running and listening there?"
    )
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    assert "nats (connecting)" in caplog.text  # each try is still there at DEBUG


async def test_a_missing_or_garbage_credential_file_is_named(tmp_path):
    missing = tmp_path / "ups-monitor.creds"
    with pytest.raises(ConnectError, match=rf"NATS credential file {missing} does not exist: give the service's own"):
        await Bus.connect("nats://127.0.0.1:1", service="x", creds_file=missing, setup=False)
    garbage = tmp_path / "garbage.creds"
    garbage.write_text("-----BEGIN NATS USER JWT-----\nnot.a.jwt\n------END NATS USER JWT------\n")
    with pytest.raises(ConnectError, match=rf"{garbage} is not a NATS credential \(a user JWT and an nkey seed\)"):
        await Bus.connect("nats://127.0.0.1:1", service="x", creds_file=garbage, setup=False)
    with pytest.raises(ConnectError, match=r"tls ca .*ca\.pem does not exist"):
        await Bus.connect("nats://127.0.0.1:1", service="x", tls_ca=tmp_path / "ca.pem", setup=False)


async def test_a_credential_of_another_deployment_is_refused_in_words(tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    dep = start(tmp_path / "site")
    try:
        other = tmp_path / "other"
        creds_mod.init(other, names=BusNames(), sites=["dc1"])
        with pytest.raises(ConnectError) as exc:
            await Bus.connect(dep.url, service="x", creds_file=other / "observer.creds", setup=False, connect_timeout=2)
        assert "the server refused the credential (" in str(exc.value)
        assert "authorization violation" in str(exc.value).lower()
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    finally:
        dep.server.stop()
