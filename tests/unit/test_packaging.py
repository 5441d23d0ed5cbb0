"""The event contract is installable and usable alone: `powerguard.schemas` imports without the
transport (nats-py, aiohttp, OpenTelemetry, prometheus_client, nkeys), and its distribution
declares only pydantic and PyYAML."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BLOCKED = ("nats", "aiohttp", "opentelemetry", "prometheus_client", "nkeys", "powerguard.bus")

PROBE = f"""
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {BLOCKED!r} or name.startswith("powerguard.bus"):
            raise ImportError("blocked: " + name)
        return None
sys.meta_path.insert(0, Block())
from powerguard.schemas import OnBattery, PowerData, decode, encode, load_site, Subjects
e = OnBattery(data=PowerData(site="dc1", ups="u1", on_battery=True))
assert decode(encode(e)) == e and Subjects().power("dc1", "u1") == "pg.power.dc1.u1"
print("ok")
"""


def test_the_contract_imports_without_the_transport():
    r = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


def test_the_contract_declares_only_pydantic_and_pyyaml():
    deps = tomllib.loads((ROOT / "schemas" / "pyproject.toml").read_text())["project"]["dependencies"]
    assert sorted(d.split(">")[0].split("=")[0].split("<")[0].lower() for d in deps) == ["pydantic", "pyyaml"]
    bus = tomllib.loads((ROOT / "bus" / "pyproject.toml").read_text())["project"]["dependencies"]
    assert "powerguard-schemas" in bus and any(d.startswith("nats-py") for d in bus)
