"""The deployment files as shipped: compose files validate with docker-compose, the alert rules
pass promtool's check and unit tests, and every metric the rules and the dashboard use is one a
service exports."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import require_binary

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose"


@pytest.fixture
def compose_dir(tmp_path) -> Path:
    """A copy of compose/ with generated secrets and a site file, as an operator prepares it."""
    work = tmp_path / "compose"
    shutil.copytree(COMPOSE, work, ignore=shutil.ignore_patterns("secrets", "wheels", "site.yaml"))
    shutil.copy(work / "site.sim.yaml", work / "site.yaml")
    powerguard = str(Path(sys.executable).parent / "powerguard")
    out = subprocess.run(
        ["sh", str(work / "make-secrets.sh")],
        capture_output=True,
        text=True,
        env={**os.environ, "POWERGUARD": powerguard},
    )
    assert out.returncode == 0, out.stderr
    return work


@pytest.mark.parametrize("files", [["docker-compose.yml"], ["docker-compose.yml", "nats-cluster.yml"]])
def test_compose_files_validate(compose_dir, files):
    docker_compose = require_binary("docker-compose", "docker-compose")
    args = [a for f in files for a in ("-f", str(compose_dir / f))]
    out = subprocess.run(
        [docker_compose, *args, "--profile", "sim", "--profile", "observability", "config"],
        capture_output=True,
        text=True,
        cwd=compose_dir,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    config = yaml.safe_load(out.stdout)
    services = config["services"]
    assert {"nats", "ups-monitor", "coordinator", "power-control", "sim", "trainer", "jaeger"} <= set(services)
    for name in ("ups-monitor", "coordinator", "power-control"):
        assert services[name]["depends_on"]["nats"]["condition"] == "service_healthy"
        assert services[name]["depends_on"]["bootstrap"]["condition"] == "service_completed_successfully"
        env = services[name]["environment"]
        assert env["NATS_CREDS"] == f"/run/secrets/nats_{name.replace('-', '_')}"  # its own credential
        assert env["NATS_URL"].startswith("tls://") and env["NATS_CA"] == "/run/secrets/nats_ca"
    assert services["bootstrap"]["environment"]["NATS_CREDS"] == "/run/secrets/nats_admin"  # the only admin
    assert services["trainer"]["environment"]["NATS_CREDS"] == "/run/secrets/nats_job_demo_train"
    assert all(not str(p).endswith(":8222") for p in services["nats"].get("ports", []))  # monitoring stays inside
    if "nats-cluster.yml" in files:
        assert {"nats-2", "nats-3"} <= set(services)
        assert "nats-3" in services["coordinator"]["environment"]["NATS_URL"]


def test_make_secrets_gives_every_party_its_credential_and_the_server_its_certificate(compose_dir):
    secrets = compose_dir / "secrets"
    for role in ("admin", "ups-monitor", "coordinator", "power-control", "observer", "operator"):
        assert "BEGIN NATS USER JWT" in (secrets / "nats" / f"{role}.creds").read_text()
    assert (secrets / "nats" / "agent-demo-train.creds").exists()
    assert "resolver_preload" in (secrets / "nats" / "resolver.conf").read_text()
    assert {"ca.pem", "server-cert.pem", "server-key.pem"} <= {p.name for p in (secrets / "tls").iterdir()}
    assert oct((secrets / "nats" / "account-signing.nk").stat().st_mode & 0o777) == "0o600"


def test_alert_rules_check_and_unit_tests():
    promtool = require_binary("promtool", "prometheus")
    prom = COMPOSE / "prometheus"
    check = subprocess.run([promtool, "check", "rules", "alerts.yml"], cwd=prom, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    test = subprocess.run([promtool, "test", "rules", "alerts.test.yml"], cwd=prom, capture_output=True, text=True)
    assert test.returncode == 0, test.stdout + test.stderr


def _exported_metrics() -> set[str]:
    names = set()
    for path in [*ROOT.glob("*/**/metrics.py"), ROOT / "bus" / "src" / "powerguard" / "bus" / "health.py"]:
        for kind, name in re.findall(r"(Gauge|Counter|Histogram)\(\s*\"(\w+)\"", path.read_text()):
            counter = kind == "Counter" and not name.endswith("_total")
            names.add(name + ("_total" if counter else ""))
            if kind == "Histogram":
                names.update({name + "_bucket", name + "_sum", name + "_count"})
    return names


def test_rules_and_dashboard_use_only_metrics_the_services_export():
    exported = _exported_metrics() | {"up"}
    used = set(re.findall(r"\b(powerguard_\w+)", (COMPOSE / "prometheus" / "alerts.yml").read_text()))
    dashboard = json.loads((COMPOSE / "grafana" / "powerguard.json").read_text())
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            used |= set(re.findall(r"\b(powerguard_\w+)", target["expr"]))
    assert used and used <= exported, sorted(used - exported)


def test_every_alert_has_a_severity_and_a_runbook_section():
    rules = yaml.safe_load((COMPOSE / "prometheus" / "alerts.yml").read_text())
    sections = set(re.findall(r"^## (\w+)$", (ROOT / "docs" / "runbooks.md").read_text(), re.M))
    for group in rules["groups"]:
        for rule in group["rules"]:
            name = rule["alert"]
            assert rule["labels"]["severity"] in ("critical", "warning", "info"), name
            assert rule["annotations"]["runbook_url"] == f"docs/runbooks.md#{name.lower()}", name
            assert name in sections, f"docs/runbooks.md has no section for {name}"


def test_alertmanager_config_checks():
    amtool = require_binary("amtool", "prometheus-alertmanager")
    check = subprocess.run(
        [amtool, "check-config", str(COMPOSE / "alertmanager" / "alertmanager.yml")], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr


def test_a_configuration_error_stops_a_unit_instead_of_looping():
    """Every long-running service exits 2 on a wrong site file or flag
    (tests/integration/test_config_check.py::test_each_service_exits_2_*); its unit restarts it on
    any other exit, never on that one."""
    units = Path(__file__).resolve().parents[2] / "packaging" / "systemd"
    for name in ("coordinator", "power-control", "ups-monitor", "exporter", "console"):
        text = (units / f"powerguard-{name}.service").read_text()
        assert "Restart=always" in text and "RestartPreventExitStatus=2" in text, name
