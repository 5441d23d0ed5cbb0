"""A simulated UPS as a NUT driver: it speaks NUT's driver socket protocol to a real ``upsd``
(which connects to ``<statepath>/<driver>-<ups>`` and asks ``DUMPALL``, ``PING``, ``INSTCMD``),
so clients talk to Debian's upsd exactly as to a site's, and the UPS honours the instant
commands of a long outage's last step, which ``dummy-ups`` only logs as unknown:

* ``shutdown.return [delay]``: the output goes off ``delay`` seconds later (default
  ``ups.delay.shutdown``) and comes back ``ups.delay.start`` seconds after mains returns;
* ``shutdown.stayoff [delay]``: the output goes off and stays off;
* ``shutdown.stop``: a pending shutdown is cancelled;
* ``load.off`` / ``load.on``: the output now.

The output's state is ``ups.status`` (``OFF`` while it is off, as real drivers report it) and
:attr:`NutDriverUps.output_on`; every change is logged with its time in :attr:`log`. Mains is
the test's to switch (:meth:`mains`). Results go back through NUT's command tracking
(``TRACKING <id> <status>``) so upsd can tell its client the command was handled.

Runs as a thread of the calling process; every method is safe from any thread. The clock is
``time.monotonic`` (the delays are real seconds, as a UPS's are).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import threading
import time
from pathlib import Path

from powerguard.bus.embedded import with_parent

from .nut import UPSD_PATHS, find, free_port

HANDLED, FAILED, UNKNOWN, INVALID = 0, 1, 2, 3  # NUT's STAT_INSTCMD_* as the tracking status
COMMANDS = ("shutdown.return", "shutdown.stayoff", "shutdown.stop", "load.off", "load.on")


class NutDriverUps:
    def __init__(
        self,
        tmp: Path,
        *,
        ups: str = "ups1",
        delay_shutdown_s: float = 1.0,
        delay_start_s: float = 0.5,
        commands: tuple[str, ...] = COMMANDS,
        users: str = "[admin]\n password = secret\n instcmds = ALL\n",
    ) -> None:
        self.tmp, self.ups, self.port = tmp, ups, free_port()
        self.upsd = find(UPSD_PATHS, "upsd")
        self.commands = commands
        self.delay_shutdown_s, self.delay_start_s = delay_shutdown_s, delay_start_s
        self.log: list[tuple[float, str]] = []
        self._lock = threading.Lock()
        self._mains = True
        self.output_on = True
        self._off_at: float | None = None  # a pending shutdown: when the output goes off
        self._return = False  # ... and whether it comes back with mains
        self._on_at: float | None = None  # mains is back: when the output comes on
        self._stop = threading.Event()
        self._conn: socket.socket | None = None
        (tmp / "state").mkdir(parents=True, exist_ok=True)
        (tmp / "ups.conf").write_text(f"[{ups}]\n driver = pgsim\n port = none\n")
        (tmp / "upsd.conf").write_text(f"LISTEN 127.0.0.1 {self.port}\n")
        (tmp / "upsd.users").write_text(users)
        (tmp / "upsd.users").chmod(0o600)
        self._sock_path = str(tmp / "state" / f"pgsim-{ups}")
        self._proc: subprocess.Popen | None = None
        self._threads: list[threading.Thread] = []

    # -------------------------------------------------------------- the test's side
    def start(self) -> NutDriverUps:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._sock_path)
        server = socket.socket(socket.AF_UNIX)
        server.bind(self._sock_path)
        server.listen(1)
        self._threads = [
            threading.Thread(target=self._serve, args=(server,), daemon=True, name="nut-driver"),
            threading.Thread(target=self._clock, daemon=True, name="nut-driver-clock"),
        ]
        for t in self._threads:
            t.start()
        env = {**os.environ, "NUT_CONFPATH": str(self.tmp), "NUT_STATEPATH": str(self.tmp / "state")}
        log = open(self.tmp / "upsd.log", "ab")  # the process keeps it
        self._proc = subprocess.Popen(
            with_parent([self.upsd, "-u", "root", "-F"]), env=env, stdout=log, stderr=log, start_new_session=True
        )
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    s.sendall(f"GET VAR {self.ups} ups.status\n".encode())
                    if s.recv(200).startswith(b"VAR "):
                        return self
            time.sleep(0.05)
        raise RuntimeError(f"upsd not ready: {(self.tmp / 'upsd.log').read_text()[-2000:]}")

    def stop(self) -> None:
        self._stop.set()
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        if self._conn is not None:
            with contextlib.suppress(OSError):
                self._conn.close()

    def mains(self, on: bool) -> None:
        """Utility power fails (False) or returns (True)."""
        with self._lock:
            self._mains = on
            self._event(f"mains {'on' if on else 'off'}")
            if on and not self.output_on and self._return and self._off_at is None:
                self._on_at = time.monotonic() + self.delay_start_s
            self._publish()

    def events(self, what: str | None = None) -> list[tuple[float, str]]:
        with self._lock:
            return [e for e in self.log if what is None or e[1] == what]

    # -------------------------------------------------------------- the UPS
    def _event(self, what: str) -> None:
        self.log.append((time.monotonic(), what))

    def _status(self) -> str:
        if not self.output_on:
            return "OFF"
        return "OL" if self._mains else "OB DISCHRG"

    def _vars(self) -> dict[str, str]:
        return {
            "ups.status": self._status(),
            "battery.charge": "100" if self._mains else "50",
            "battery.runtime": "600" if self._mains else "300",
            "ups.delay.shutdown": f"{self.delay_shutdown_s:g}",
            "ups.delay.start": f"{self.delay_start_s:g}",
        }

    def _publish(self) -> None:
        conn = self._conn
        if conn is None:
            return
        with contextlib.suppress(OSError):
            conn.sendall("".join(f'SETINFO {k} "{v}"\n' for k, v in self._vars().items()).encode())

    def _clock(self) -> None:
        while not self._stop.wait(0.05):
            with self._lock:
                now = time.monotonic()
                if self._off_at is not None and now >= self._off_at:
                    self._off_at = None
                    self.output_on = False
                    self._event("output off")
                    if self._return and self._mains:  # mains came back meanwhile: the UPS cycles its output
                        self._on_at = now + self.delay_start_s
                    self._publish()
                elif self._on_at is not None and now >= self._on_at:
                    self._on_at = None
                    self.output_on, self._return = True, False
                    self._event("output on")
                    self._publish()

    def _instcmd(self, cmd: str, arg: str | None) -> int:
        if cmd not in self.commands:
            return UNKNOWN
        try:
            delay = float(arg) if arg is not None else self.delay_shutdown_s
        except ValueError:
            return INVALID
        now = time.monotonic()
        self._event(f"instcmd {cmd}" + (f" {arg}" if arg is not None else ""))
        if cmd in ("shutdown.return", "shutdown.stayoff"):
            self._off_at, self._return, self._on_at = now + max(0.0, delay), cmd == "shutdown.return", None
        elif cmd == "shutdown.stop":
            self._off_at = None
        elif cmd == "load.off":
            self._off_at, self._return, self._on_at = now, False, None
        elif cmd == "load.on" and not self.output_on:
            self._on_at = now
        return HANDLED

    def _serve(self, server: socket.socket) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            self._conn = conn
            with conn, conn.makefile("r") as lines:
                for line in lines:
                    words = line.split()
                    if not words:
                        continue
                    reply = ""
                    with self._lock:
                        if words[0] == "DUMPALL":
                            reply = "".join(f'SETINFO {k} "{v}"\n' for k, v in self._vars().items())
                            reply += "".join(f"ADDCMD {c}\n" for c in self.commands) + "DATAOK\nDUMPDONE\n"
                        elif words[0] == "PING":
                            reply = "PONG\n"
                        elif words[0] == "INSTCMD" and len(words) >= 2:
                            tracking = None
                            if "TRACKING" in words:
                                i = words.index("TRACKING")
                                tracking, words = words[i + 1], words[:i]
                            status = self._instcmd(words[1], words[2] if len(words) > 2 else None)
                            if tracking is not None:
                                reply = f"TRACKING {tracking} {status}\n"
                    if reply:
                        with contextlib.suppress(OSError):
                            conn.sendall(reply.encode())
            self._conn = None
