"""`powerguard config check --offline`: the whole file against every service's schema, the secrets,
each party's credential; a line per problem naming it, exit 1 (the CLI as a process)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from powerguard.bus import BusNames
from powerguard.bus import creds as creds_mod

pytestmark = pytest.mark.integration
POWERGUARD = str(Path(sys.executable).parent / "powerguard")

SITE = """\
site: dc1
ups:
  - {name: ups-a, driver: nut, port: 3493}
nodes:
  - name: n1
    feeds: [ups-a]
    bmc: {driver: ipmi, port: 6230, username: {env: PG_CHECK_BMC_USER}, password: {file: PASSWORD_FILE}}
coordinator: {shutdown_reserve_s: 90}
"""


@pytest.fixture
def deployment(tmp_path, monkeypatch):
    monkeypatch.setenv("PG_CHECK_BMC_USER", "admin")
    (tmp_path / "bmc.pw").write_text("secret\n")
    (tmp_path / "bmc.pw").chmod(0o640)  # the guide's mode: the services' group reads it
    site = tmp_path / "site.yaml"
    site.write_text(SITE.replace("PASSWORD_FILE", str(tmp_path / "bmc.pw")))
    creds_mod.init(tmp_path / "creds", names=BusNames(), sites=["dc1"])
    return site, tmp_path / "creds"


def check(site: Path, creds: Path, *extra: str, online: bool = False) -> tuple[int, list[str]]:
    mode = ["--url", "nats://127.0.0.1:1", "--timeout", "0.5"] if online else ["--offline"]
    out = subprocess.run(
        [POWERGUARD, "config", "check", *mode, "--site", str(site), "--creds-dir", str(creds), *extra],
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ,
    )
    assert "Traceback" not in out.stderr, out.stderr
    return out.returncode, [ln for ln in out.stdout.splitlines() if ln.startswith("PROBLEM")] + [out.stderr.strip()]


def test_a_good_deployment_passes(deployment):
    site, creds = deployment
    code, lines = check(site, creds)
    assert code == 0, lines
    assert lines[-1].startswith("no problem in ") and "checks of the files" in lines[-1]


def test_a_top_level_typo_names_the_key(deployment):
    site, creds = deployment
    site.write_text(site.read_text().replace("coordinator:", "coordinater:"))
    code, lines = check(site, creds)
    assert code == 1
    assert f"PROBLEM site file: {site}: coordinater: unknown top-level section; did you mean 'coordinator'?" in lines


def test_a_bad_value_in_one_services_section_is_refused(deployment):
    site, creds = deployment
    site.write_text(site.read_text() + "power_control: {device_timeout_s: -1}\n")
    code, lines = check(site, creds)
    assert code == 1
    assert any(ln.startswith("PROBLEM section power_control: power_control.device_timeout_s: ") for ln in lines), lines


def test_a_missing_secret_is_named_once_with_its_place(deployment, tmp_path):
    site, creds = deployment
    (tmp_path / "bmc.pw").unlink()
    code, lines = check(site, creds)
    assert code == 1
    hits = [ln for ln in lines if "bmc.pw" in ln]
    assert len(hits) == 1 and hits[0].startswith("PROBLEM secret nodes[n1].bmc.password: file:"), lines
    assert "No such file or directory" in hits[0]


def test_a_wrong_or_open_credential_is_named(deployment):
    site, creds = deployment
    shutil.copy(creds / "observer.creds", creds / "ups-monitor.creds")
    (creds / "coordinator.creds").chmod(0o644)
    (creds / "power-control.creds").write_text("garbage\n")
    code, lines = check(site, creds)
    assert code == 1
    assert (
        f"PROBLEM credential ups-monitor: {creds / 'ups-monitor.creds'} is the observer credential, not ups-monitor's"
        in lines
    )
    assert any(ln.startswith("PROBLEM credential coordinator: ") and "chmod 600" in ln for ln in lines), lines
    assert any(
        ln.startswith("PROBLEM credential power-control: ") and "is not a NATS credential" in ln for ln in lines
    ), lines


def test_credentials_made_for_another_site_are_named(deployment, tmp_path):
    site, _ = deployment
    other = tmp_path / "other"
    creds_mod.init(other, names=BusNames(), sites=["dc2"])
    code, lines = check(site, other)
    assert code == 1
    assert any("made for site(s) dc2, not dc1" in ln for ln in lines), lines


def test_a_bad_job_adapter_option_is_named_not_a_traceback(deployment):
    site, creds = deployment
    site.write_text(
        site.read_text() + "power_control: {scheduler: {kind: process, options: {jobs: {train: {argvv: [x]}}}}}\n"
    )
    code, lines = check(site, creds)
    assert code == 1
    assert any(
        ln.startswith(
            "PROBLEM job adapter: process job adapter: power_control.scheduler.options.jobs.train.argv: Field required"
        )
        for ln in lines
    ), lines
    out = subprocess.run(
        [sys.executable, "-m", "powerguard.power_control", "--config", str(site)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "power_control.scheduler.options.jobs.train.argvv: Extra inputs are not permitted" in out.stderr


def test_secrets_readable_by_every_user_and_a_ca_key_on_the_host_are_named(deployment, tmp_path):
    """Before: a 0644 BMC password, a 0644 seed in the credentials directory and the CA's key
    beside ca.pem passed the check."""
    site, creds = deployment
    (tmp_path / "bmc.pw").chmod(0o644)
    (creds / "account-signing.nk").chmod(0o644)
    tls = tmp_path / "tls"
    subprocess.run(
        ["sh", str(Path(__file__).parents[2] / "compose" / "make-certs.sh"), str(tls), "localhost"],
        check=True,
        capture_output=True,
    )
    site.write_text(site.read_text() + f"nats: {{tls_ca: {tls / 'ca.pem'}}}\n")
    code, lines = check(site, creds)
    assert code == 1
    pw, nk = tmp_path / "bmc.pw", creds / "account-signing.nk"
    assert any(
        f"secret nodes[n1].bmc.password: {pw} (secret) is mode 0644" in ln and f"chmod 600 {pw}" in ln for ln in lines
    ), lines
    assert any(f"{nk}: mode -rw-r--r--" in ln for ln in lines), lines
    assert any(f"{tls / 'ca-key.pem'} is on this host" in ln for ln in lines), lines
    (tmp_path / "bmc.pw").chmod(0o600)
    (creds / "account-signing.nk").chmod(0o600)
    (tls / "ca-key.pem").unlink()  # moved offline, as the guide says
    code, lines = check(site, creds)
    assert code == 0, lines


BROKEN = {
    "top-level typo": ("coordinater: {}\n", "coordinater: unknown top-level section"),
    "coordinator value": ("coordinator: {shutdown_reserve_s: soon}\n", "coordinator.shutdown_reserve_s:"),
    "power_control type": ("power_control: {device_timeout_s: abc}\n", "power_control.device_timeout_s:"),
    "power_control scheduler typo": ("power_control: {scheduler: {kindd: slurm}}\n", "power_control.scheduler.kindd:"),
    "ups_monitor type": ("ups_monitor: {timeout_s: [1]}\n", "ups_monitor.timeout_s:"),
    "ups_monitor unknown key": ("ups_monitor: {pol_interval_s: 5}\n", "ups_monitor.pol_interval_s:"),
}


@pytest.mark.parametrize("online", [False, True], ids=["offline", "online"])
@pytest.mark.parametrize("broken", sorted(BROKEN))
def test_every_broken_site_file_is_one_line_online_and_offline(deployment, broken, online):
    """Before: online, an error in the power_control or ups_monitor section was an 80-line
    traceback (the live checks built those services' settings again, unguarded)."""
    site, creds = deployment
    text, names = BROKEN[broken]
    if broken == "coordinator value":  # the file already has a coordinator section
        site.write_text(site.read_text().replace("coordinator: {shutdown_reserve_s: 90}\n", text))
    else:
        site.write_text(site.read_text() + text)
    code, lines = check(site, creds, online=online)  # asserts no traceback
    assert code == 1
    named = [ln for ln in lines if names in ln]
    assert len(named) == 1 and named[0].startswith("PROBLEM "), lines


SERVICES = {
    "coordinator": [sys.executable, "-m", "powerguard.coordinator"],
    "power-control": [sys.executable, "-m", "powerguard.power_control"],
    "ups-monitor": [sys.executable, "-m", "powerguard.ups_monitor"],
    "exporter": [sys.executable, "-m", "powerguard.bus.health"],
    "console": [POWERGUARD, "console"],
}


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_each_service_exits_2_on_a_wrong_site_file_naming_the_field(deployment, service):
    """Exit 2 is what the units do not restart (RestartPreventExitStatus=2): a wrong file stops the
    unit with its reason as the journal's last line, instead of a restart every 2 s. Before, the
    exporter and the console exited 1 (restarted forever)."""
    site, _ = deployment
    site.write_text(site.read_text().replace("coordinator: {shutdown_reserve_s: 90}", "coordinater: {}"))
    out = subprocess.run(
        [*SERVICES[service], "--config", str(site)], capture_output=True, text=True, timeout=120, env=os.environ
    )
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    assert "Traceback" not in out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert "coordinater: unknown top-level section; did you mean 'coordinator'?" in last, out.stderr[-2000:]
