"""A shutdown or restore step that fails for any reason ends in `power.action_failed` with the
reason and a terminal ledger entry, at once; one bad order never holds back the others; an
unfinished ledger entry of a saga that moved on is not resumed. Real IPMI (the simulated BMC)."""

from __future__ import annotations

import pytest

from powerguard.power_control.ledger import Ledger
from powerguard.schemas import PowerActionFailed
from tests.integration.power.conftest import make_bmc  # noqa: F401 (the BMC peer)
from tests.integration.power.helpers import Recorder, creds, power_on, service, shutdown, site

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


async def test_a_missing_bmc_secret_ends_the_shutdown_reported_not_silently(make_bus, make_bmc, monkeypatch):  # noqa: F811
    cred = creds(monkeypatch)
    ok_bmc, bad_bmc = make_bmc("n1"), make_bmc("n2")
    broken = {**cred, "password": {"file": "/run/secrets/does-not-exist"}}
    cfg = site(
        [
            {"name": "n1", "bmc": {"driver": "ipmi", "host": "127.0.0.1", "port": ok_bmc.port, **cred}},
            {"name": "n2", "bmc": {"driver": "ipmi", "host": "127.0.0.1", "port": bad_bmc.port, **broken}},
        ],
        soft_off_timeout_s=1.0,
    )
    bus = await make_bus("power-control")
    rec = await Recorder().start(bus)
    pc = await service(bus, cfg)
    try:
        for n in ("n1", "n2", "n9"):
            await bus.publish(shutdown(n))
        await rec.wait(lambda: "off" in rec.states("n1"), what="n1 off")
        await rec.wait(lambda: rec.of(PowerActionFailed, node="n2"), what="n2 reported failed")
        await rec.wait(lambda: rec.of(PowerActionFailed, node="n9"), what="the unknown node refused")
        await pc.idle()
        ledger = Ledger(await bus.power_actions(), "t")
        assert [e.key for e in await ledger.unfinished()] == []  # nothing left "running"
        assert "does-not-exist" in rec.of(PowerActionFailed, node="n2")[0].data.error
        assert "not in the site file" in rec.of(PowerActionFailed, node="n9")[0].data.error
        # a power-on batch with the broken node still powers the good one on
        for n in ("n1", "n2"):
            await bus.publish(power_on(n))
        await rec.wait(lambda: "ready" in rec.states("n1"), what="n1 ready despite n2")
    finally:
        await pc.stop()


HUNG_BMC_CALL = """
import asyncio, sys, time
from powerguard.power_control.drivers.base import Guarded
from powerguard.power_control.drivers.ipmi import IpmiDriver
from powerguard.power_control.errors import DeviceUnreachable

class Hung(IpmiDriver):
    def _command(self):  # pyghmi stuck in its own retries, never returning
        time.sleep(3600)

async def main():
    bmc = Hung("bmc:n1", Guarded("bmc:n1", timeout_s=0.5), host="127.0.0.1", port=9, user="u", password="p")
    try:
        await bmc.status()
    except DeviceUnreachable as exc:
        print("reported:", exc, flush=True)

asyncio.run(main())
print("exited", flush=True)
"""


def test_a_hung_bmc_call_is_reported_and_never_holds_up_the_exit(tmp_path):
    """A BMC call that never returns ends in DeviceUnreachable at the driver's timeout, and the
    process (power-control on SIGTERM, a test's event loop) still exits: with asyncio.to_thread
    the loop's shutdown joined the hung thread forever."""
    import subprocess
    import sys

    script = tmp_path / "hung.py"
    script.write_text(HUNG_BMC_CALL)
    try:
        r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"the process did not exit: {exc.stdout!r}") from None
    assert "reported: bmc:n1: no answer to get power within 0.5s" in r.stdout, r.stdout + r.stderr
    assert "exited" in r.stdout and r.returncode == 0
