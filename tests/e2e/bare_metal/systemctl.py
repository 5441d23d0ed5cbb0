"""``systemctl`` for the bare-metal test (python -m tests.e2e.bare_metal.systemctl ...): start,
stop, restart, reload, enable [--now], daemon-reload and is-active of the units in
$PG_TEST_ROOT/etc/systemd/system, each unit's main process started as its ExecStart= says
(units.py) in its own session, logs in $PG_TEST_ROOT/log/<unit>.log. A stop honours KillMode=:
``process`` signals the main process only; the default (control-group) signals it and every
process it started."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from .units import load, prepare

ROOT = Path(os.environ["PG_TEST_ROOT"])
ROOTS = json.loads((ROOT / "roots.json").read_text())
UNITS = ROOT / "etc" / "systemd" / "system"
RUN = ROOT / "run"
LOGS = ROOT / "log"


def _name(unit: str) -> str:
    return unit if "." in unit else f"{unit}.service"


def _pid(name: str) -> int | None:
    try:
        pid = int((RUN / "units" / f"{name}.pid").read_text())
    except (OSError, ValueError):
        return None
    try:
        p = psutil.Process(pid)
        return pid if p.status() != psutil.STATUS_ZOMBIE else None
    except psutil.NoSuchProcess:
        return None


def start(name: str) -> None:
    if name.endswith(".target") or _pid(name):
        return
    unit = load(UNITS, name)
    argv, env = prepare(unit, roots=ROOTS, run_dir=RUN)
    LOGS.mkdir(parents=True, exist_ok=True)
    (RUN / "units").mkdir(parents=True, exist_ok=True)
    with open(LOGS / f"{name}.log", "ab") as log:
        log.write(f"--- start {' '.join(argv)}\n".encode())
        log.flush()
        if unit.get("Type") == "oneshot":
            rc = subprocess.run(argv, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=300).returncode
            if rc != 0:
                sys.stderr.write(f"{name}: ExecStart exited {rc}\n{(LOGS / f'{name}.log').read_text()[-3000:]}")
                sys.exit(1)
            return
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    (RUN / "units" / f"{name}.pid").write_text(str(proc.pid))


def stop(name: str) -> None:
    pid = _pid(name)
    if pid is None:
        return
    unit = load(UNITS, name)
    main = psutil.Process(pid)
    procs = [main] if unit.get("KillMode", "control-group") == "process" else [main, *main.children(recursive=True)]
    for p in procs:
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=float(unit.get("TimeoutStopSec", "30")))
    for p in alive:
        p.kill()
    (RUN / "units" / f"{name}.pid").unlink(missing_ok=True)


def reload(name: str) -> None:
    pid = _pid(name)
    if pid is None:
        sys.exit(f"{name} is not active, cannot reload")
    os.kill(pid, signal.SIGHUP)


def main(argv: list[str]) -> None:
    args = [a for a in argv if not a.startswith("-")]
    verb, units = args[0], [_name(u) for u in args[1:]]
    if verb == "daemon-reload":
        return
    if verb == "enable":
        if "--now" in argv:
            for u in units:
                start(u)
        return
    for u in units:
        if verb == "start":
            start(u)
        elif verb == "stop":
            stop(u)
        elif verb == "restart":
            stop(u)
            start(u)
        elif verb == "reload":
            reload(u)
        elif verb == "is-active":
            print("active" if _pid(u) else "inactive")
        else:
            sys.exit(f"systemctl (test): {verb} is not emulated")
    time.sleep(0)


if __name__ == "__main__":
    main(sys.argv[1:])
