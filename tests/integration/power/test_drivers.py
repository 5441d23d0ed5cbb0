"""Each power driver against its real peer: actions are read back from the peer itself."""

from __future__ import annotations

import asyncio
import time

import pytest

from powerguard.power_control.drivers.base import Guarded
from powerguard.power_control.drivers.ipmi import IpmiDriver
from powerguard.power_control.drivers.ipmitool import IpmitoolDriver
from powerguard.power_control.drivers.pdu import ApcPduDriver
from powerguard.power_control.drivers.redfish import RedfishDriver
from powerguard.power_control.errors import (
    AuthenticationFailed,
    CommandRejected,
    CredentialsDoubted,
    DeviceUnreachable,
    PowerControlError,
    TlsUntrusted,
)
from tests.waiting import eventually

from .peers import PASSWORD, USER, free_udp_port, ipmitool

pytestmark = pytest.mark.integration


@pytest.fixture(params=["ipmitool", "pyghmi"])
def ipmi(request):
    """Both IPMI transports, each against the same peers."""
    cls = IpmitoolDriver if request.param == "ipmitool" else IpmiDriver

    def make(port: int, *, password: str = PASSWORD, user: str = USER, timeout_s: float = 8.0):
        guard = Guarded("bmc:n1", timeout_s=timeout_s)
        return cls("bmc:n1", guard, host="127.0.0.1", port=port, user=user, password=password)

    return make


async def until(fn, want, timeout: float = 5.0):
    await eventually(lambda: fn() == want, timeout, f"the power state {want!r}", every=0.05)
    return want


async def test_ipmi_against_openipmi_ipmi_sim(ipmi_sim, ipmi):
    d = ipmi(ipmi_sim.port)
    assert await d.status() == "on"
    await d.soft_off()
    assert ipmi_sim.power == "off" and await d.status() == "off"
    await d.on()
    assert ipmi_sim.power == "on" and await d.status() == "on"
    await d.off()
    assert ipmi_sim.power == "off"


async def test_ipmi_against_the_simulated_bmc_agrees_with_ipmitool(make_bmc, ipmi):
    bmc = make_bmc(soft_off_delay=0.2)
    d = ipmi(bmc.port)
    assert await d.status() == "on"
    await d.soft_off()
    assert await until(lambda: bmc.power, "off") == "off"
    out = ipmitool(bmc.port, "chassis", "power", "status").stdout
    assert "Chassis Power is off" in out
    assert await d.restore_policy() == "always-off"
    await d.set_restore_policy("always-on")
    assert await d.restore_policy() == "always-on"
    out = ipmitool(bmc.port, "chassis", "status").stdout
    assert "Power Restore Policy : always-on" in out


class _Slot:
    def __init__(self, start: float) -> None:
        self.start = start
        self.started: float | None = None

    async def wait(self) -> None:
        while time.monotonic() < self.start:
            await asyncio.sleep(0.005)
        self.started = time.time()


async def test_ipmi_power_on_in_a_ramp_slot_goes_out_at_the_slot(make_bmc, ipmi):
    """The session is opened ahead; the BMC sees the power-on only after the slot began."""
    bmc = make_bmc(power="off")
    slot = _Slot(time.monotonic() + 1.0)
    await ipmi(bmc.port).on_at(slot)
    (seen, _), *_ = bmc.events("command on")
    assert slot.started is not None and seen >= slot.started - 0.01  # the BMC's own clock
    assert await until(lambda: bmc.power, "on") == "on"


async def test_ipmi_power_on_in_a_slot_with_a_wrong_password_names_the_cause(make_bmc, ipmi):
    bmc = make_bmc(power="off")
    d = ipmi(bmc.port, password="wrong")
    with pytest.raises(CredentialsDoubted, match=r"bmc:n1.*credentials.*once"):
        await d.on_at(_Slot(time.monotonic()))
    with pytest.raises(AuthenticationFailed, match=r"bmc:n1.*credentials"):  # a fresh session: refused again
        await d.on_at(_Slot(time.monotonic()))
    assert bmc.changes == 0


async def test_ipmi_wrong_password_fails_fast_and_is_not_retried(make_bmc, ipmi):
    bmc = make_bmc()
    d = ipmi(bmc.port, password="wrong")
    t = time.monotonic()
    with pytest.raises(CredentialsDoubted, match=r"bmc:n1.*credentials"):
        await d.status()
    with pytest.raises(AuthenticationFailed, match=r"bmc:n1.*credentials"):
        await d.status()
    assert time.monotonic() - t < 4
    with pytest.raises(AuthenticationFailed, match="not retried"):  # held off: the BMC is not asked again
        await d.on()
    assert bmc.changes == 0


async def test_ipmi_a_session_the_bmc_garbles_once_is_doubted_and_the_next_one_works(make_bmc, ipmi):
    """A BMC under load answers one session with a RAKP 2 message whose HMAC does not verify
    ("RAKP 2 HMAC is invalid"): that is not taken for a refused password; the next session works."""
    bmc = make_bmc(garble_sessions=1)
    d = ipmi(bmc.port)
    with pytest.raises(CredentialsDoubted):
        await d.status()
    assert await d.status() == "on"
    assert [what for _, what in bmc.events()] == ["session garbled"]


def test_ipmitool_refuses_a_password_longer_than_ipmi_allows_naming_the_limit():
    with pytest.raises(PowerControlError, match=r"bmc:n1: the BMC password is 21 bytes; IPMI 2.0 allows at most 20"):
        IpmitoolDriver("bmc:n1", Guarded("bmc:n1", timeout_s=1), host="127.0.0.1", user=USER, password="x" * 21)


async def test_ipmi_unknown_user_is_an_authentication_error(make_bmc, ipmi):
    d = ipmi(make_bmc().port, user="nobody")
    with pytest.raises(CredentialsDoubted):
        await d.status()
    with pytest.raises(AuthenticationFailed):
        await d.status()


async def test_ipmi_nothing_listening_times_out_within_the_bound(ipmi):
    t = time.monotonic()
    with pytest.raises(DeviceUnreachable, match="bmc:n1"):
        await ipmi(free_udp_port(), timeout_s=2.0).status()
    assert time.monotonic() - t < 3.0


def redfish(sushy, **kw) -> RedfishDriver:
    args = dict(base_url=sushy.url, user=USER, password=PASSWORD, ca_bundle=str(sushy.ca))
    args.update(kw)
    return RedfishDriver("bmc:node1", Guarded("bmc:node1", timeout_s=5), **args)


async def test_redfish_reset_actions_read_back_from_the_emulator(sushy):
    d = redfish(sushy)
    try:
        assert await d.status() == "on"
        await d.soft_off()
        assert await until(sushy.power, "Off") == "Off"
        await d.on()
        assert await until(sushy.power, "On") == "On"
        await d.off()
        assert await until(sushy.power, "Off") == "Off"
        assert await d.status() == "off"
    finally:
        await d.close()


async def test_redfish_untrusted_certificate_is_refused_unless_allowed(sushy):
    strict = redfish(sushy, ca_bundle=None)
    lax = redfish(sushy, ca_bundle=None, verify_tls=False)
    try:
        with pytest.raises(TlsUntrusted, match="does not verify"):
            await strict.status()
        assert await lax.status() == "on"
    finally:
        await strict.close()
        await lax.close()


async def test_redfish_wrong_password_is_an_authentication_error(sushy):
    d = redfish(sushy, password="wrong")
    try:
        with pytest.raises(CredentialsDoubted, match="401"):
            await d.off()
        with pytest.raises(AuthenticationFailed, match="401"):  # refused again: believed
            await d.off()
        assert sushy.power() == "On"
    finally:
        await d.close()


async def test_redfish_nothing_listening_is_unreachable():
    d = RedfishDriver("bmc:x", Guarded("bmc:x", timeout_s=2), base_url="https://127.0.0.1:1", user="a", password="b")
    try:
        with pytest.raises(DeviceUnreachable, match="cannot reach"):
            await d.status()
    finally:
        await d.close()


def apc(pdu, community: str = "private") -> ApcPduDriver:
    from pysnmp.hlapi.v3arch.asyncio import CommunityData

    auth = CommunityData(community, mpModel=1)
    return ApcPduDriver("pdu:p1", Guarded("pdu:p1", timeout_s=5), host="127.0.0.1", port=pdu.port, auth=auth)


async def test_pdu_outlets_switch_and_read_back(pdu):
    d = apc(pdu)
    assert await d.outlet_state(2) == "off"
    await d.set_outlet(2, True)
    assert pdu.outlets()["2"] == "on" and await d.outlet_state(2) == "on"
    await d.set_outlet(2, False)
    assert pdu.outlets()["2"] == "off"


async def test_pdu_read_only_community_is_refused(pdu):
    with pytest.raises(CommandRejected, match="noAccess"):
        await apc(pdu, community="public").set_outlet(1, True)
    assert pdu.outlets()["1"] == "off"


async def test_pdu_unknown_outlet_is_refused(pdu):
    with pytest.raises(CommandRejected, match="outlet 9"):
        await apc(pdu).outlet_state(9)
