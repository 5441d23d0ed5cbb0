"""Every command's --help says what it does, as written: no `<bool>` for a flag, no markup eaten
(`powerguard-ckpt-agent[lightning]`), every option described; the services' --help names the
environment that gives each its own credential."""

from __future__ import annotations

import subprocess
import sys

import click
import pytest
import typer
from typer.testing import CliRunner

from powerguard.cli.main import app


def commands(group: click.Group, prefix: tuple[str, ...] = ()):
    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            yield from commands(cmd, (*prefix, name))
        else:
            yield (*prefix, name), cmd


ALL = sorted(commands(typer.main.get_command(app)))


@pytest.mark.parametrize("path", [p for p, _ in ALL], ids=" ".join)
def test_help_renders_every_option_described_and_no_bool_metavar(path):
    out = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "120"})
    assert out.exit_code == 0, out.output
    assert "<bool>" not in out.output
    cmd = dict(ALL)[path]
    for param in cmd.params:
        if isinstance(param, click.Option) and param.name != "help":
            assert param.help, f"powerguard {' '.join(path)} {param.opts[0]} has no help"


def test_extras_in_brackets_survive_the_help():
    out = CliRunner().invoke(app, ["demo", "--help"], env={"COLUMNS": "200"})
    assert "powerguard-ckpt-agent[lightning]or[hf]" in "".join(out.output.split())  # wrapped anywhere


def test_power_dry_run_is_described():
    out = CliRunner().invoke(app, ["power", "on", "--help"], env={"COLUMNS": "200"})
    assert "touch no BMC or PDU" in out.output


@pytest.mark.parametrize("module", ["powerguard.ups_monitor", "powerguard.coordinator", "powerguard.power_control"])
def test_services_help_names_the_credential_environment(module):
    out = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=60)
    text = " ".join(out.stdout.split())
    assert out.returncode == 0
    for word in ("--creds", "--ca", "NATS_CREDS", "NATS_CA", "NATS_URL", "POWERGUARD_CONFIG"):
        assert word in text, word


def test_health_exporter_help_describes_its_options():
    out = subprocess.run(
        [sys.executable, "-m", "powerguard.bus.health", "--help"], capture_output=True, text=True, timeout=60
    )
    text = " ".join(out.stdout.split())
    assert out.returncode == 0 and "observer's credential" in text
    for option in ("--http-host", "--http-port", "--every-s", "--creds"):
        assert option in text


def test_status_fits_100_columns_with_the_saga_id_whole():
    """Before: eleven columns squeezed into 100 were unreadable (the guide's terminal)."""
    import io

    from rich.console import Console

    from powerguard.cli.main import status_view

    row = {
        "saga": "dc1-20261204T211920-f87b",
        "state": "holding",
        "drill": True,
        "acks": "512/512",
        "budget_left_s": 41.0,
        "ups_on_battery": ["ups-a", "ups-b"],
        "nodes_at_risk": [f"gpu{i:02d}" for i in range(12)],
        "hold_s": 120.0,
        "lost_steps": None,
        "jobs": {},
        "restore": None,
        "age_s": 75.0,
        "reason": "runtime 100s below the 120s shutdown reserve",
    }
    for width in (80, 100):
        out = io.StringIO()
        Console(file=out, width=width, force_terminal=False).print(status_view([row], width))
        text = out.getvalue()
        assert max(len(line) for line in text.splitlines()) <= width, text
        assert "dc1-20261204T211920-f87b" in text and "holding (drill)" in text and "512/512" in text, text


def test_a_site_file_is_config_or_site_and_a_site_name_is_site_name_in_every_command():
    """One meaning per flag (an SRE's `--site` worked in `drill` and was refused by `status`, and
    meant a site's *name* in `bootstrap`): every command with a site-file option takes both
    `--config` and `--site` for it (one option line), and a site's name is `--site-name`."""
    import re

    flag = re.compile(r"(?<![\w-])(--config|--site|--site-name)(?![\w-])")
    paths = [p for p, _ in ALL] + [("config", "check"), ("creds", "init"), ("power", "status"), ("power", "off")]
    files, wrong = [], []
    for path in paths:
        out = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "200"}).output
        for line in out.splitlines():
            line = line.strip()
            if not re.match(r"-{1,2}[\w-]+(,| <|  |$)", line):
                continue  # an option's own line starts with its flags; its help text may name others
            declared = set(flag.findall(line.split("  ")[0]))
            if declared & {"--config", "--site"}:
                files.append(" ".join(path))
                if not {"--config", "--site"} <= declared:
                    wrong.append((" ".join(path), line))
    assert len(files) >= 10, files
    assert not wrong, wrong
    names = CliRunner().invoke(app, ["creds", "init", "--help"], env={"COLUMNS": "200"}).output
    assert "--site-name" in names
