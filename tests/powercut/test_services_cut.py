"""PowerGuard's own state through a power cut of the broker and the services mid-outage
(:mod:`tests.powercut.services_campaign`; bench/powercut.py runs many seeds): with the broker
settings PowerGuard ships (``sync_interval: always``) the saga survives, finishes, and no node
is power-cycled twice. Fixed seeds: a cut while the nodes shut down, and one while they power
on again. (With NATS's default ``sync_interval`` the saga itself is lost with the power:
``services_cut(..., sync="2m")``, checked when this test was written.)"""

from __future__ import annotations

import pytest

from tests.conftest import IN_CI

from . import unavailable
from .services_campaign import services_cut

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    ("seed", "servers"),
    [
        (1, 1),  # cut while shutting down
        (9, 1),  # while restoring
        (9, 3),  # a 3-node cluster (R3), every server's store cut at the same instant, while restoring
    ],
)
async def test_a_power_cut_of_the_broker_and_the_services_mid_outage_loses_nothing_they_acted_on(
    tmp_path, seed, servers
):
    if why := unavailable():
        if IN_CI:
            pytest.fail(f"power-cut filesystem: {why} (CI must provide it)")
        pytest.skip(why)
    assert await services_cut(tmp_path, seed, servers=servers) == []
