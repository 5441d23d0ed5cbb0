"""Site YAML: validation with errors that name the field, secrets by reference only."""

from __future__ import annotations

import textwrap

import pytest

from powerguard.schemas import ConfigError, SecretNotFound, SecretRef, load_site

SITE = """
site: dc1
nats: {url: "nats://127.0.0.1:4222"}
ups:
  - {name: ups-a, driver: snmp, host: 127.0.0.1, port: 1161}
  - {name: ups-b, driver: nut}
pdus:
  - {name: pdu1, host: 127.0.0.1}
nodes:
  - name: n1
    feeds: [ups-a, ups-b]
    outlets: [{pdu: pdu1, outlet: 3}]
    bmc: {driver: ipmi, port: 6230, username: {env: BMC_USER}, password: {file: /run/secrets/bmc}}
coordinator: {shutdown_reserve_s: 90}
"""


def write(tmp_path, text):
    p = tmp_path / "site.yaml"
    p.write_text(textwrap.dedent(text))
    return p


def test_valid_site_loads_with_service_sections(tmp_path):
    site = load_site(write(tmp_path, SITE))
    assert site.site == "dc1"
    assert site.nodes[0].feeds == ["ups-a", "ups-b"]
    assert site.section("coordinator") == {"shutdown_reserve_s": 90}
    assert site.section("ups_monitor") == {}


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (("feeds: [ups-a, ups-b]", "feeds: [ups-a, ups-z]"), "feed 'ups-z' is not a configured UPS"),
        (("{pdu: pdu1, outlet: 3}", "{pdu: pdu9, outlet: 3}"), "unknown PDU 'pdu9'"),
        (("driver: nut", "driver: usb"), r"ups\.1\.driver"),
        (("name: n1", "name: n1.example.com"), "cannot be used in a NATS subject"),
        (("{env: BMC_USER}", "{env: A, file: /x}"), "exactly one"),
        (("{env: BMC_USER}", "plaintext"), "username"),
    ],
)
def test_invalid_sites_name_the_problem(tmp_path, change, match):
    with pytest.raises(ConfigError, match=match):
        load_site(write(tmp_path, SITE.replace(*change)))


def test_unreadable_or_invalid_yaml(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_site(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_site(write(tmp_path, "site: [unclosed"))


def test_secret_refs_resolve_without_leaking(tmp_path, monkeypatch):
    monkeypatch.setenv("PG_TEST_SECRET", "hunter2")
    ref = SecretRef(env="PG_TEST_SECRET")
    value = ref.resolve()
    assert value.get_secret_value() == "hunter2"
    assert "hunter2" not in repr(value) and "hunter2" not in str(ref)
    f = tmp_path / "pw"
    f.write_text("s3cret\n")
    assert SecretRef(file=f).resolve().get_secret_value() == "s3cret"
    with pytest.raises(SecretNotFound, match="PG_TEST_MISSING"):
        SecretRef(env="PG_TEST_MISSING").resolve()
    with pytest.raises(SecretNotFound, match="cannot read"):
        SecretRef(file=tmp_path / "nope").resolve()


def test_shipped_example_site_is_valid():
    from pathlib import Path

    example = Path(__file__).resolve().parents[2] / "compose" / "site.example.yaml"
    site = load_site(example)
    assert {n.name for n in site.nodes} == {"gpu01", "gpu02"}
    # its scheduler block is what power-control builds its job adapter from
    from powerguard.power_control.config import PowerControlSettings
    from powerguard.power_control.schedulers import make_scheduler

    scheduler = make_scheduler(site.settings("power_control", PowerControlSettings).scheduler)
    assert scheduler.kind == "process" and "llama-70b" in scheduler.opts.jobs


@pytest.mark.parametrize(
    ("module", "section", "bad", "match"),
    [
        ("powerguard.coordinator", "coordinator", "{shutdown_reserve_s: -5}", "coordinator.shutdown_reserve_s"),
        ("powerguard.coordinator", "coordinator", "{hold_policy: sometimes}", "coordinator.hold_policy"),
        ("powerguard.ups_monitor", "ups_monitor", "{poll_interval_s: fast}", "ups_monitor.poll_interval_s"),
        ("powerguard.power_control", "power_control", "{scheduler: {kind: pbs}}", "power_control.scheduler.kind"),
    ],
)
def test_a_bad_service_section_exits_2_naming_the_field_before_connecting(tmp_path, module, section, bad, match):
    import subprocess
    import sys

    site = tmp_path / "site.yaml"
    site.write_text(
        f"site: dc1\nups: [{{name: u1, driver: nut}}]\nnodes: [{{name: n1, feeds: [u1]}}]\n{section}: {bad}\n"
    )
    r = subprocess.run(
        [sys.executable, "-m", module, "--config", str(site), "--nats-url", "nats://127.0.0.1:1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and match in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_a_top_level_typo_is_refused_naming_the_key_and_the_near_one(tmp_path):
    with pytest.raises(ConfigError) as exc:
        load_site(write(tmp_path, SITE + "coordinater: {shutdown_reserve_s: 60}\n"))
    assert "coordinater: unknown top-level section; did you mean 'coordinator'?" in str(exc.value)
    with pytest.raises(ConfigError, match=r"alerting: unknown top-level section \(the top-level keys are site, "):
        load_site(write(tmp_path, SITE + "alerting: {}\n"))


def test_a_service_section_must_be_a_mapping(tmp_path):
    with pytest.raises(ConfigError, match="power_control: Input should be a valid dictionary"):
        load_site(write(tmp_path, SITE + "power_control: 5\n"))
