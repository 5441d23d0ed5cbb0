"""A real NUT server for tests: ``dummy-ups`` + ``upsd`` on a free loopback port."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

from tests.conftest import require_binary


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class NutServer:
    def __init__(self, tmp: Path, *, ups: str = "ups1", status: str = "OL CHRG") -> None:
        self.upsd = require_binary("upsd", "nut-server") if not os.path.exists("/lib/nut/upsd") else "/lib/nut/upsd"
        self.dummy = "/lib/nut/dummy-ups"
        if not os.path.exists(self.dummy):
            require_binary("dummy-ups-not-installed", "nut-server")
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

    def start(self) -> NutServer:
        log = open(self.tmp / "nut.log", "ab")
        self.procs.append(
            subprocess.Popen(
                [self.dummy, "-a", self.ups, "-u", "root", "-F"],
                env=self.env,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        )
        self._wait_for_socket()
        self.procs.append(
            subprocess.Popen(
                [self.upsd, "-u", "root", "-F"], env=self.env, stdout=log, stderr=log, start_new_session=True
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
