"""`powerguard power status|on|off|audit` as an operator runs them, against real BMCs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from .peers import PASSWORD, USER

pytestmark = pytest.mark.integration


def write_site(tmp_path, nodes: list[dict]) -> str:
    path = tmp_path / "site.yaml"
    cred = {"username": {"env": "PG_CLI_USER"}, "password": {"env": "PG_CLI_PASSWORD"}}
    path.write_text(
        yaml.safe_dump(
            {
                "site": "dc1",
                "ups": [{"name": "ups-a", "driver": "nut"}],
                "nodes": [{"feeds": ["ups-a"], **n, "bmc": {**n["bmc"], **cred}} for n in nodes],
                "power_control": {"restore_policy": "always-on"},
            }
        )
    )
    return str(path)


def powerguard(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PG_CLI_USER": USER, "PG_CLI_PASSWORD": PASSWORD, "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "powerguard.cli", "power", *args], capture_output=True, text=True, env=env, timeout=60
    )


def test_audit_finds_a_node_that_would_stay_off_and_fix_sets_the_policy(tmp_path, make_bmc, sushy):
    bmc = make_bmc("n1")  # starts with policy always-off
    site = write_site(
        tmp_path,
        [
            {"name": "n1", "bmc": {"driver": "ipmi", "host": "127.0.0.1", "port": bmc.port}},
            {
                "name": "rf1",
                "bmc": {
                    "driver": "redfish",
                    "host": "127.0.0.1",
                    "port": sushy.port,
                    "options": {"ca_bundle": str(sushy.ca)},
                },
            },
        ],
    )
    r = powerguard("audit", "--site", site, "--json")
    assert r.returncode == 3, r.stderr
    rows = {row["node"]: row for row in json.loads(r.stdout)}
    assert rows["n1"]["restore_policy"] == "always-off" and rows["n1"]["verdict"].startswith("would not")
    assert "does not report" in rows["rf1"]["verdict"]  # sushy's fake driver has no PowerRestorePolicy
    r = powerguard("audit", "--site", site, "--node", "n1", "--fix", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)[0]["verdict"] == "fixed"
    assert json.loads(bmc.state.read_text())["policy"] == 2  # the BMC itself now says always-on


def test_status_off_and_on(tmp_path, make_bmc):
    bmc = make_bmc("n1", boot_delay=0.1)
    site = write_site(tmp_path, [{"name": "n1", "bmc": {"driver": "ipmi", "host": "127.0.0.1", "port": bmc.port}}])
    r = powerguard("status", "--site", site)
    assert r.returncode == 0 and "n1" in r.stdout and "on" in r.stdout
    r = powerguard("off", "--site", site, "--node", "n1")
    assert r.returncode == 0, r.stderr
    assert bmc.power == "off"
    r = powerguard("on", "--site", site, "--node", "n1", "--json")
    assert r.returncode == 0 and bmc.events("command on")


def test_actions_need_a_node_and_unknown_nodes_are_named(tmp_path, make_bmc):
    bmc = make_bmc("n1")
    site = write_site(tmp_path, [{"name": "n1", "bmc": {"driver": "ipmi", "host": "127.0.0.1", "port": bmc.port}}])
    r = powerguard("off", "--site", site)
    assert r.returncode == 2 and "--node" in r.stderr
    r = powerguard("status", "--site", site, "--node", "nope")
    assert r.returncode == 2 and "nope" in r.stderr
    assert bmc.power == "on"
