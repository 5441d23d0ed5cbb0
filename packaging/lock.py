"""The locks: the exact set of distributions a release was tested with, read from the environment
the tests ran in (``make venv``: every project installed with ``-c constraints.txt``).

    python packaging/lock.py write    # after a dependency changed: constraints.txt and the two locks
    python packaging/lock.py check    # each lock is what this environment holds (exit 1 naming what differs)

* ``constraints.txt``: every distribution of the dev and CI environment (the projects' own,
  installed editable, aside), ``name==version``. ``make venv`` and CI install from it, so CI
  tests exactly this set.
* ``packaging/locks/management.txt``: what a management host installs (``powerguard`` and
  everything it needs, transitively, with the extras the root project asks for), the same
  versions. ``make wheels`` ships it as ``dist/wheels/constraints.txt``; the bare-metal guide
  installs with ``-c`` it.
* ``packaging/locks/agent.txt``: the ckpt-agent with its ``lightning``, ``hf`` and ``s3`` extras
  (``dist/agent-wheels/constraints.txt``), without torch and what only torch needs: a site
  installs the torch build of its GPUs (the agent declares a range).

No hashes: the projects' own wheels are built at the site, and the dev and CI torch is a local CPU
build, while pip's hash-checking mode wants a hash on every requirement or none; the pins are
exact. Reads installed metadata only (``importlib.metadata``): offline, no resolver.
"""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
CONSTRAINTS = ROOT / "constraints.txt"
LOCKS = ROOT / "packaging" / "locks"
OWN = {"powerguard", "powerguard-schemas", "powerguard-bus", "powerguard-snmp", "powerguard-ups-monitor"}
OWN |= {"powerguard-coordinator", "powerguard-power-control", "powerguard-ckpt-agent"}
INSTALLERS = {"pip", "setuptools", "wheel"}  # the installer's own, never a requirement of ours
SITE_TORCH = {"torch"}  # the agent lock leaves torch to the site (its GPUs' build)

HEADER = {
    "constraints.txt": (
        "# The dev and CI environment, exactly (python packaging/lock.py write; checked by\n"
        "# tests/unit/test_locks.py). The CPU build of torch lies on the dev/CI machines' disk; letting\n"
        "# pip pick another would download a multi-GB CUDA build. Sites install their own torch\n"
        "# (services/ckpt-agent declares torch>=2.4).\n"
    ),
    "management.txt": (
        "# A management host's environment as tested: powerguard and everything it needs, exact\n"
        "# (python packaging/lock.py write; `make wheels` ships it as dist/wheels/constraints.txt).\n"
    ),
    "agent.txt": (
        "# The ckpt-agent's environment as tested, with its lightning, hf and s3 extras, exact; torch is\n"
        "# the site's own build (python packaging/lock.py write; dist/agent-wheels/constraints.txt).\n"
    ),
}


def installed() -> dict[str, metadata.Distribution]:
    out = {}
    for dist in metadata.distributions():
        name = canonicalize_name(dist.metadata["Name"])
        out.setdefault(name, dist)
    return out


def pin(dist: metadata.Distribution) -> str:
    name, version = canonicalize_name(dist.metadata["Name"]), dist.version
    if name in SITE_TORCH:
        version = version.split("+")[0]  # the local build's label (+cpu): any build of that version
    return f"{name}=={version}"


def closure(roots: list[str], have: dict[str, metadata.Distribution], skip: set[str] = frozenset()) -> set[str]:
    """The distributions ``roots`` (requirement strings, extras included) need, transitively, as
    installed here; ``skip``: left out, with what only they need."""
    env = default_environment()
    seen: set[str] = set()
    todo = [Requirement(r) for r in roots]
    done: set[tuple[str, frozenset[str]]] = set()
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in skip or (name, frozenset(req.extras)) in done:
            continue
        done.add((name, frozenset(req.extras)))
        dist = have.get(name)
        if dist is None:
            raise SystemExit(f"{req} is needed but not installed here: run `make venv` first")
        seen.add(name)
        for raw in dist.requires or []:
            sub = Requirement(raw)
            wanted = [{**env, "extra": e} for e in (req.extras or {""})]
            if sub.marker is None or any(sub.marker.evaluate(w) for w in wanted):
                todo.append(sub)
    return seen


def locks() -> dict[Path, str]:
    have = installed()
    everything = sorted(n for n in have if n not in OWN | INSTALLERS)
    management = sorted(closure(["powerguard"], have) - OWN)
    agent = sorted(closure(["powerguard-ckpt-agent[lightning,hf,s3]"], have, skip=SITE_TORCH) - OWN)
    text = lambda names, head: head + "".join(pin(have[n]) + "\n" for n in names)  # noqa: E731
    return {
        CONSTRAINTS: text(everything, HEADER["constraints.txt"]),
        LOCKS / "management.txt": text(management, HEADER["management.txt"]),
        LOCKS / "agent.txt": text(agent, HEADER["agent.txt"]),
    }


def main(argv: list[str]) -> int:
    if argv[1:] not in (["write"], ["check"]):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    want = locks()
    if argv[1] == "write":
        LOCKS.mkdir(parents=True, exist_ok=True)
        for path, text in want.items():
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)} ({text.count('==')} pins)")
        return 0
    stale = [str(p.relative_to(ROOT)) for p, text in want.items() if not p.exists() or p.read_text() != text]
    if stale:
        print(f"not what this environment holds: {', '.join(stale)} (python packaging/lock.py write)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
