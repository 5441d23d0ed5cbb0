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
from .peers import PyghmiBmc, free_udp_port

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
