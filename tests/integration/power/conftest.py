"""Fixtures: each real peer on free loopback ports, stopped by PID at the end."""

from __future__ import annotations

import pytest

from .cluster_peers import Dockerd, Slurm
from .peers import IpmiSim, PyghmiBmc, SnmpPdu, SushyBmc


@pytest.fixture
def ipmi_sim(tmp_path):
    peer = IpmiSim(tmp_path).start()
    yield peer
    peer.stop()


@pytest.fixture
def make_bmc(tmp_path):
    started: list[PyghmiBmc] = []

    def make(name: str = "n1", **kw) -> PyghmiBmc:
        bmc = PyghmiBmc(tmp_path, name, **kw).start()
        started.append(bmc)
        return bmc

    yield make
    for b in started:
        b.stop()


@pytest.fixture
def sushy(tmp_path):
    peer = SushyBmc(tmp_path).start()
    yield peer
    peer.stop()


@pytest.fixture
def pdu(tmp_path):
    peer = SnmpPdu(tmp_path).start()
    yield peer
    peer.stop()


@pytest.fixture
def slurm(tmp_path):
    peer = Slurm(tmp_path)
    try:
        peer.start()
    except RuntimeError as exc:
        peer.stop()
        pytest.fail(str(exc))
    yield peer
    peer.stop()


@pytest.fixture(scope="module")
def dockerd(tmp_path_factory):
    peer = Dockerd(tmp_path_factory.mktemp("dockerd"))
    try:
        peer.start()
    except RuntimeError as exc:
        peer.stop()
        pytest.fail(str(exc))
    yield peer
    peer.stop()
