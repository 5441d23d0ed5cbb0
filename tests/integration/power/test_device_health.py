"""power-control says when it cannot act on a node: a BMC password file missing, a BMC that does
not answer. The healthy node stays fine; the verdict names each bad node and why, and the
per-node gauge is 0 for them."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from powerguard.power_control import device_health
from powerguard.power_control.drivers import Devices
from powerguard.power_control.service import load_settings

from .helpers import creds, site
from .peers import PASSWORD, PyghmiBmc, free_udp_port

pytestmark = pytest.mark.integration


async def test_a_missing_secret_and_a_dead_bmc_make_power_control_degraded(tmp_path, monkeypatch):
    auth = creds(monkeypatch)
    bmc = PyghmiBmc(tmp_path, "n1").start()
    try:
        cfg = site(
            [
                {"name": "n1", "bmc": {"driver": "ipmi", "port": bmc.port, **auth}},
                {
                    "name": "n2",
                    "bmc": {
                        "driver": "ipmi",
                        "port": bmc.port,
                        "username": auth["username"],
                        "password": {"file": str(tmp_path / "missing.pw")},
                    },
                },
                {"name": "n3", "bmc": {"driver": "ipmi", "port": free_udp_port(), **auth}},
            ],
            device_timeout_s=2.0,
        )
        devices = Devices(cfg, load_settings(cfg))
        try:
            health = await device_health.check(devices, "dc1", ["n1", "n2", "n3"], 2.0)
        finally:
            await devices.close()
    finally:
        bmc.stop()
    ready, reason = health.verdict()
    assert not ready
    assert reason.startswith("degraded: 2 node(s) cannot be acted on: n2: "), reason
    assert sorted(health.problems) == ["n2", "n3"]
    assert "missing.pw" in health.problems["n2"]
    assert health.problems["n3"]  # no answer, in the driver's or the timeout's words
    gauge = {
        n: REGISTRY.get_sample_value("powerguard_power_device_ok", {"site": "dc1", "node": n})
        for n in "n1 n2 n3".split()
    }
    assert gauge == {"n1": 1, "n2": 0, "n3": 0}


def test_the_verdict_before_and_after_a_check():
    assert device_health.DeviceHealth().verdict() == (False, "devices not checked yet")
    assert device_health.DeviceHealth(checked=True).verdict() == (True, "ok")


async def test_a_secret_file_removed_while_running_is_seen_at_the_next_check_and_a_new_one_used(tmp_path, monkeypatch):
    """Before: secrets were read once, when a node's driver was first made: a BMC password file
    removed while power-control ran left /readyz at 200 past device_check_s. Now each check (and
    each action) reads them: the removal is named at the next check, the file put back (or
    rotated) is used at the one after."""
    auth = creds(monkeypatch)
    password = tmp_path / "n1.pw"
    password.write_text(PASSWORD)
    password.chmod(0o600)
    bmc = PyghmiBmc(tmp_path, "n1").start()
    try:
        node = {"driver": "ipmi", "port": bmc.port, "username": auth["username"], "password": {"file": str(password)}}
        cfg = site([{"name": "n1", "bmc": node}], device_timeout_s=2.0)
        devices = Devices(cfg, load_settings(cfg))
        try:
            assert (await device_health.check(devices, "dc1", ["n1"], 2.0)).verdict() == (True, "ok")
            text = password.read_text()
            password.unlink()
            ready, reason = (await device_health.check(devices, "dc1", ["n1"], 2.0)).verdict()
            assert not ready and "n1: " in reason and "n1.pw" in reason, reason
            password.write_text(text)
            assert (await device_health.check(devices, "dc1", ["n1"], 2.0)).verdict() == (True, "ok")
        finally:
            await devices.close()
    finally:
        bmc.stop()
