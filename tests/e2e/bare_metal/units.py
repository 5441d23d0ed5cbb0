"""Just enough of systemd to run PowerGuard's shipped units where systemd cannot run (CI): a unit
file's [Service] section read as systemd reads it (repeated keys, drop-ins in <unit>.d/*.conf,
Environment= with several assignments, EnvironmentFile= with its "-", LoadCredential= into a
private directory named by %d, ${VAR} in ExecStart=, KillMode=), its ExecStart= run as the
unit's main process. Paths in the units (/opt/powerguard, /etc/powerguard, /var/lib/powerguard)
are moved under a test root (``roots``); User= is not applied (one user in the test)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
from dataclasses import dataclass, field
from pathlib import Path


def remap(text: str, roots: dict[str, str]) -> str:
    """Every absolute path prefix in ``roots`` (longest first) moved to its test place."""
    for old in sorted(roots, key=len, reverse=True):
        text = re.sub(rf"(?<![\w/]){re.escape(old)}(?=/|\b|$)", roots[old], text)
    return text


@dataclass
class Unit:
    name: str
    service: dict[str, list[str]] = field(default_factory=dict)

    def get(self, key: str, default: str | None = None) -> str | None:
        values = self.service.get(key)
        return values[-1] if values else default

    def all(self, key: str) -> list[str]:
        return self.service.get(key, [])


def _read_into(unit: Unit, path: Path) -> None:
    section = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        if section != "Service" or "=" not in line:
            continue
        key, value = (x.strip() for x in line.split("=", 1))
        if value == "" and key in unit.service:  # an empty assignment resets a list
            unit.service[key] = []
            continue
        unit.service.setdefault(key, []).append(value)


def load(unit_dir: Path, name: str) -> Unit:
    unit = Unit(name)
    _read_into(unit, unit_dir / name)
    dropins = unit_dir / f"{name}.d"
    if dropins.is_dir():
        for conf in sorted(dropins.glob("*.conf")):
            _read_into(unit, conf)
    return unit


def _env_file(path: Path) -> dict[str, str]:
    out = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith("#") and "=" in line:
            k, v = line.split("=", 1)
            out[k.strip()] = v.strip().strip('"')
    return out


def _expand(text: str, env: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: env.get(m[1] or m[2], ""), text)


def prepare(unit: Unit, *, roots: dict[str, str], run_dir: Path) -> tuple[list[str], dict[str, str]]:
    """The main process's argv and environment, its credentials copied in place."""
    creds = run_dir / "credentials" / unit.name
    shutil.rmtree(creds, ignore_errors=True)
    creds.mkdir(parents=True, mode=0o700)
    loaded: dict[str, str] = {}
    for item in unit.all("LoadCredential"):
        cid, _, source = item.partition(":")
        loaded[cid] = remap(source, roots)  # a later one of the same id (a drop-in) wins
    for cid, source in loaded.items():
        dest = creds / cid
        shutil.copyfile(source, dest)  # fails like systemd when the source is missing
        dest.chmod(0o400)
    for item in unit.all("StateDirectory"):
        Path(remap(f"/var/lib/{item.split()[0]}", roots)).mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "PYTHONPATH", "TMPDIR")}
    env["CREDENTIALS_DIRECTORY"] = str(creds)
    for line in unit.all("Environment"):
        for assignment in shlex.split(line.replace("%d", str(creds))):
            k, _, v = assignment.partition("=")
            env[k] = remap(v, roots)
    for item in unit.all("EnvironmentFile"):
        optional = item.startswith("-")
        path = Path(remap(item.lstrip("-"), roots))
        if path.exists():
            env.update({k: remap(v, roots) for k, v in _env_file(path).items()})
        elif not optional:
            raise FileNotFoundError(f"{unit.name}: EnvironmentFile {path} missing")
    exec_start = unit.get("ExecStart")
    if exec_start is None:
        raise ValueError(f"{unit.name}: no ExecStart=")
    line = remap(exec_start.replace("%d", str(creds)), roots)
    argv = [_expand(a, env) for a in shlex.split(line)]
    return argv, env
