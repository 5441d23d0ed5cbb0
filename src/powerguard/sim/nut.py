"""Debian's NUT for the simulated site and the tests: ``dummy-ups`` + ``upsd`` on a free
loopback port, driven like a real UPS through upsd's own protocol (``SET VAR`` as its admin
user, what ``upsrw`` does). :meth:`NutUps.feed` writes a :class:`~powerguard.sim.ups.Battery`'s
state into it, so ups-monitor reads a real NUT server whose values move like a battery's."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from powerguard.bus.embedded import with_parent
from powerguard.schemas import PowerGuardError

UPSD_PATHS = ("/lib/nut/upsd", "/usr/lib/nut/upsd", "/usr/sbin/upsd")
DUMMY_PATHS = ("/lib/nut/dummy-ups", "/usr/lib/nut/dummy-ups")


class NutMissing(PowerGuardError):
    """NUT is not installed (Debian: apt-get install nut-server nut-client)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def find(paths: tuple[str, ...], name: str) -> str:
    for p in paths:
        if os.path.exists(p):
            return p
    found = shutil.which(name)
    if found is None:
        raise NutMissing(f"{name} not found: apt-get install nut-server nut-client")
    return found


class NutUps:
    def __init__(self, tmp: Path, *, ups: str = "ups1", status: str = "OL CHRG") -> None:
        self.upsd = find(UPSD_PATHS, "upsd")
        self.dummy = find(DUMMY_PATHS, "dummy-ups")
        self.tmp, self.ups, self.port = tmp, ups, free_port()
        (tmp / "state").mkdir(parents=True, exist_ok=True)
        (tmp / "ups.conf").write_text(f'[{ups}]\n driver = dummy-ups\n port = {ups}.dev\n desc = "test"\n')
        (tmp / f"{ups}.dev").write_text(
            f"ups.status: {status}\nbattery.charge: 100\nbattery.runtime: 1800\nups.load: 40\ninput.voltage: 230\n"
        )
        (tmp / "upsd.conf").write_text(f"LISTEN 127.0.0.1 {self.port}\n")
        users = tmp / "upsd.users"
        users.write_text(
            "[admin]\n password = secret\n actions = SET\n instcmds = ALL\n"
            "[monitor]\n password = mon\n upsmon primary\n"
        )
        users.chmod(0o600)
        self.env = {**os.environ, "NUT_CONFPATH": str(tmp), "NUT_STATEPATH": str(tmp / "state")}
        self.procs: list[subprocess.Popen] = []
        self._fed: dict[str, str] = {}

    def start(self) -> NutUps:
        log = open(self.tmp / "nut.log", "ab")
        self.procs.append(
            subprocess.Popen(
                with_parent([self.dummy, "-a", self.ups, "-u", "root", "-F"]),
                env=self.env,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        )
        self._wait_for_socket()
        self.procs.append(
            subprocess.Popen(
                with_parent([self.upsd, "-u", "root", "-F"]),
                env=self.env,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        )
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                if "WAIT" not in self.command(f"GET VAR {self.ups} ups.status") and "ERR" not in self.command(
                    f"GET VAR {self.ups} ups.status"
                ):
                    return self
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"upsd not ready: {(self.tmp / 'nut.log').read_text()[-2000:]}")

    def _wait_for_socket(self) -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if any(p.name.startswith("dummy-ups") for p in (self.tmp / "state").iterdir()):
                return
            time.sleep(0.02)

    def command(self, *lines: str) -> str:
        with socket.create_connection(("127.0.0.1", self.port), timeout=2) as s:
            f = s.makefile("rw")
            out = ""
            for line in lines:
                f.write(line + "\n")
                f.flush()
                out = f.readline().strip()
            return out

    def set_status(self, status: str, **values: float) -> None:
        """Change the simulated UPS like an operator would, through upsd (SET VAR as admin)."""
        lines = ["USERNAME admin", "PASSWORD secret", f'SET VAR {self.ups} ups.status "{status}"']
        lines += [f'SET VAR {self.ups} {k} "{v}"' for k, v in values.items()]
        reply = self.command(*lines)
        assert reply == "OK", reply

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(5)
                except subprocess.TimeoutExpired:
                    p.kill()
        self.procs.clear()

    def feed(
        self, *, on_battery: bool, charge_pct: float, runtime_s: float, load_pct: float, low: bool, fsd: bool = False
    ) -> None:
        """Write a battery's state into the UPS (only the variables that changed)."""
        status = ("OB DISCHRG" if on_battery else "OL CHRG") + (" LB" if low else "") + (" FSD" if fsd else "")
        values = {
            "ups.status": status,
            "battery.charge": f"{charge_pct:.0f}",
            "battery.runtime": f"{max(0.0, runtime_s):.0f}",
            "ups.load": f"{load_pct:.0f}",
        }
        changed = {k: v for k, v in values.items() if self._fed.get(k) != v}
        if not changed:
            return
        lines = ["USERNAME admin", "PASSWORD secret"] + [f'SET VAR {self.ups} {k} "{v}"' for k, v in changed.items()]
        reply = self.command(*lines)
        if reply != "OK":
            raise PowerGuardError(f"upsd refused SET VAR: {reply}")
        self._fed.update(changed)
