"""Run a training job on simulated nodes: the job runs while every node it uses has power.

    python -m powerguard.sim.launch --node-state n1.json --node-state n2.json -- torchrun ...

Refuses to start when a node is off (exit 3); kills the job and every process below it the
moment a node's BMC reports it off (a power cut: exit 137); a SIGTERM to its process group (a
graceful stop by the scheduler adapter) reaches the job, and it exits with the job's status.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def powered(state: Path) -> bool:
    try:
        return json.loads(state.read_text()).get("power") == "on"
    except (OSError, ValueError):
        return False


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m powerguard.sim.launch", description=__doc__.split("\n\n")[0])
    p.add_argument("--node-state", type=Path, action="append", required=True, help="A node's BMC state file")
    p.add_argument("--poll-s", type=float, default=0.1)
    p.add_argument("--done", type=Path, help="Write this file when the command exits 0 (the job finished)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the job's command")
    args = p.parse_args(argv)
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        p.error("no command given")
    off = [str(s) for s in args.node_state if not powered(s)]
    if off:
        print(f"launch: node(s) powered off: {', '.join(off)}; not starting", file=sys.stderr)
        return 3
    child = subprocess.Popen(cmd)
    # a graceful stop signals our process group: the job gets it too; we just wait for it
    signal.signal(signal.SIGTERM, lambda *_: None)
    signal.signal(signal.SIGINT, lambda *_: None)
    while child.poll() is None:
        if not all(powered(s) for s in args.node_state):
            for pid in [child.pid, *descendants(child.pid)]:  # torchrun's workers may sit in other groups
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            child.wait()
            print("launch: a node lost power; the job died with it", file=sys.stderr)
            return 137
        time.sleep(args.poll_s)
    if child.returncode == 0 and args.done is not None:
        args.done.write_text("0\n")
    return child.returncode


if __name__ == "__main__":
    sys.exit(main())
