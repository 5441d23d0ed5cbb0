"""A real net-snmp ``snmpd`` on loopback serving a UPS through ``pass_persist``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import require_binary
from tests.waiting import eventually_sync

from .nut_peer import free_port

AGENT = Path(__file__).with_name("ups_agent.py")
V3_USER, V3_AUTH, V3_PRIV = "pguser", "authpass123", "privpass123"


def start_snmpd(
    snmpd: str, conf: Path, port: int, tmp: Path, *, community: str, probe: str, log: str = "snmpd.log"
) -> subprocess.Popen:
    """snmpd in the foreground on 127.0.0.1:port, once ``probe`` answers an INTEGER (or RuntimeError)."""
    (tmp / "persist").mkdir(exist_ok=True)
    out = open(tmp / log, "ab")
    proc = subprocess.Popen(
        [snmpd, "-f", "-Lo", "-C", "-c", str(conf), f"udp:127.0.0.1:{port}"],
        env={**os.environ, "SNMP_PERSISTENT_DIR": str(tmp / "persist")},
        stdout=out,
        stderr=out,
        start_new_session=True,
    )

    def answers() -> bool:
        r = subprocess.run(
            ["snmpget", "-v2c", "-c", community, "-t", "0.3", "-r", "0", f"127.0.0.1:{port}", probe],
            capture_output=True,
            text=True,
        )
        return r.returncode == 0 and "INTEGER" in r.stdout

    eventually_sync(answers, 15, "snmpd to answer", every=0.1, details=lambda: (tmp / log).read_text()[-2000:])
    return proc


class SnmpUps:
    def __init__(
        self, tmp: Path, *, community: str = "public", extra_users: tuple[str, ...] = (), port: int | None = None
    ) -> None:
        self.snmpd = require_binary("snmpd", "snmpd")
        require_binary("snmpget", "snmp")
        self.tmp, self.port, self.community = tmp, port or free_port(), community
        self.state = tmp / "ups-state.json"
        self.set(on_battery=False)
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
        self.proc = start_snmpd(
            self.snmpd, self.conf, self.port, self.tmp, community=self.community, probe=".1.3.6.1.2.1.33.1.4.1.0"
        )
        return self

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
