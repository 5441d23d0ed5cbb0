"""A real net-snmp ``snmpd`` on loopback serving a UPS through ``pass_persist``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import require_binary

from .nut_peer import free_port

AGENT = Path(__file__).with_name("ups_agent.py")
V3_USER, V3_AUTH, V3_PRIV = "pguser", "authpass123", "privpass123"


class SnmpUps:
    def __init__(
        self, tmp: Path, *, community: str = "public", extra_users: tuple[str, ...] = (), port: int | None = None
    ) -> None:
        self.snmpd = require_binary("snmpd", "snmpd")
        require_binary("snmpget", "snmp")
        self.tmp, self.port, self.community = tmp, port or free_port(), community
        self.state = tmp / "ups-state.json"
        self.set(on_battery=False)
        (tmp / "persist").mkdir(exist_ok=True)
        conf = tmp / "snmpd.conf"
        agent = f"{sys.executable} {AGENT} {self.state}"
        conf.write_text(
            f"rocommunity {community} 127.0.0.1\n"
            f"createUser {V3_USER} SHA {V3_AUTH} AES {V3_PRIV}\n"
            f"rouser {V3_USER} priv\n"
            + "".join(f"createUser {u} SHA {V3_AUTH} AES {V3_PRIV}\nrouser {u} priv\n" for u in extra_users)
            + f"pass_persist .1.3.6.1.2.1.33 {agent}\n"
            f"pass_persist .1.3.6.1.4.1.318 {agent}\n"
        )
        self.conf = conf
        self.proc: subprocess.Popen | None = None

    def set(self, **state) -> None:
        tmp = self.state.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        os.replace(tmp, self.state)

    def start(self) -> SnmpUps:
        env = {**os.environ, "SNMP_PERSISTENT_DIR": str(self.tmp / "persist")}
        log = open(self.tmp / "snmpd.log", "ab")
        self.proc = subprocess.Popen(
            [self.snmpd, "-f", "-Lo", "-C", "-c", str(self.conf), f"udp:127.0.0.1:{self.port}"],
            env=env,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            r = subprocess.run(
                [
                    "snmpget",
                    "-v2c",
                    "-c",
                    self.community,
                    "-t",
                    "0.3",
                    "-r",
                    "0",
                    f"127.0.0.1:{self.port}",
                    ".1.3.6.1.2.1.33.1.4.1.0",
                ],
                capture_output=True,
                text=True,
            )
            if r.returncode == 0 and "INTEGER" in r.stdout:
                return self
            time.sleep(0.1)
        raise RuntimeError(f"snmpd not ready: {(self.tmp / 'snmpd.log').read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
