"""Real peers for power-control tests: net-snmp snmpd as an APC PDU, OpenIPMI ipmi_sim,
the project's pyghmi-based BMC, sushy-emulator over TLS with basic auth."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from tests.conftest import require_binary
from tests.integration.ups.nut_peer import free_port
from tests.integration.ups.snmp_peer import start_snmpd
from tests.waiting import eventually_sync

HERE = Path(__file__).parent
USER, PASSWORD = "admin", "s3cret-pw"


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(5)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()


def _spawn(argv: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
    out = open(log, "ab")
    return subprocess.Popen(argv, stdout=out, stderr=out, env={**os.environ, **(env or {})}, start_new_session=True)


def ipmitool(port: int, *args: str, timeout: float = 20) -> subprocess.CompletedProcess:
    """``ipmitool -I lanplus -C 3`` (without -C 3 each call waits 10 s) as USER against 127.0.0.1:port."""
    binary = require_binary("ipmitool", "ipmitool")
    argv = [binary, "-I", "lanplus", "-C", "3", "-H", "127.0.0.1", "-p", str(port), "-U", USER, "-P", PASSWORD, *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


class SnmpPdu:
    """snmpd with pass_persist for the APC rPDU outlet table; ``rw`` and ``ro`` communities."""

    def __init__(self, tmp: Path, outlets: int = 4) -> None:
        self.snmpd = require_binary("snmpd", "snmpd")
        self.tmp, self.port = tmp, free_udp_port()
        self.state = tmp / "pdu-state.json"
        self.state.write_text(json.dumps({str(n): "off" for n in range(1, outlets + 1)}))
        self.conf = tmp / "pdu-snmpd.conf"
        self.conf.write_text(
            "rwcommunity private 127.0.0.1\nrocommunity public 127.0.0.1\n"
            f"pass_persist .1.3.6.1.4.1.318.1.1.12.3 {sys.executable} {HERE / 'pdu_agent.py'} {self.state}\n"
        )
        self.proc: subprocess.Popen | None = None

    def outlets(self) -> dict[str, str]:
        return json.loads(self.state.read_text())

    def switch_log(self) -> list[tuple[float, int, str]]:
        log = Path(str(self.state) + ".log")
        if not log.exists():
            return []
        return [(float(t), int(n), s) for t, n, s in (line.split() for line in log.read_text().splitlines())]

    def start(self) -> SnmpPdu:
        self.proc = start_snmpd(
            self.snmpd,
            self.conf,
            self.port,
            self.tmp,
            community="public",
            probe=".1.3.6.1.4.1.318.1.1.12.3.5.1.1.4.1",
            log="pdu-snmpd.log",
        )
        return self

    def stop(self) -> None:
        stop(self.proc)


class PyghmiBmc:
    """The project's simulated BMC (powerguard.sim.bmc) in its own process."""

    def __init__(
        self,
        tmp: Path,
        name: str = "n1",
        *,
        power: str = "on",
        ignore_acpi: bool = False,
        boot_delay: float = 0.3,
        soft_off_delay: float = 0.3,
        garble_sessions: int = 0,
    ) -> None:
        self.port = free_udp_port()
        self.state = tmp / f"bmc-{name}.json"
        self.state.write_text(json.dumps({"power": power, "policy": 0, "changes": 0}))
        pw = tmp / f"bmc-{name}.pw"
        pw.write_text(PASSWORD)
        self.argv = [
            sys.executable,
            "-m",
            "powerguard.sim.bmc",
            "--port",
            str(self.port),
            "--user",
            USER,
            "--password-file",
            str(pw),
            "--state",
            str(self.state),
            "--boot-delay",
            str(boot_delay),
            "--soft-off-delay",
            str(soft_off_delay),
        ] + (["--ignore-acpi"] if ignore_acpi else [])
        self.argv += ["--garble-sessions", str(garble_sessions)] if garble_sessions else []
        self.log = tmp / f"bmc-{name}.log"
        self.proc: subprocess.Popen | None = None

    @property
    def power(self) -> str:
        return json.loads(self.state.read_text())["power"]

    @property
    def changes(self) -> int:
        return json.loads(self.state.read_text())["changes"]

    def events(self, what: str | None = None) -> list[tuple[float, str]]:
        """(time, "command on" | "power on" | ...) as the BMC saw them."""
        log = Path(str(self.state) + ".log")
        rows = (
            [(float(t), rest) for t, rest in (line.split(" ", 1) for line in log.read_text().splitlines())]
            if log.exists()
            else []
        )
        return [r for r in rows if what is None or r[1] == what]

    def start(self) -> PyghmiBmc:
        self.proc = _spawn(self.argv, self.log)
        eventually_sync(
            lambda: "listening" in self.log.read_text() or _exited(self.proc, self.log),
            15,
            "the simulated BMC to listen",
            every=0.05,
            details=lambda: self.log.read_text()[-2000:],
        )
        return self

    def stop(self) -> None:
        stop(self.proc)


CHASSIS = """#!/bin/sh
# ipmi_sim chassis_control hook: <script> <mc addr> get|set <param> [value]
STATE="{state}"
shift
op=$1; shift
if [ "$op" = get ]; then
  for p in "$@"; do
    case $p in power) echo "power:$(cat "$STATE")";; boot) echo "boot:default";; esac
  done
  exit 0
fi
while [ $# -gt 0 ]; do
  p=$1; v=$2; shift 2
  case $p in
    power) echo "$v" > "$STATE"; echo "$(date +%s.%N) power $v" >> "$STATE.log";;
    shutdown) echo 0 > "$STATE"; echo "$(date +%s.%N) shutdown" >> "$STATE.log";;
    reset) echo "$(date +%s.%N) reset" >> "$STATE.log";;
  esac
done
exit 0
"""


class IpmiSim:
    """OpenIPMI's ipmi_sim with a chassis_control script whose power state is a file (0/1)."""

    def __init__(self, tmp: Path, *, power: int = 1) -> None:
        self.bin = require_binary("ipmi_sim", "openipmi")
        self.tmp, self.port = tmp, free_udp_port()
        self.state = tmp / "ipmisim-power"
        self.state.write_text(f"{power}\n")
        script = tmp / "chassis.sh"
        script.write_text(CHASSIS.format(state=self.state))
        script.chmod(0o755)
        (tmp / "ipmisim-state").mkdir(exist_ok=True)
        self.lan = tmp / "lan.conf"
        self.lan.write_text(
            'name "pgsim"\nset_working_mc 0x20\n  startlan 1\n'
            f"    addr 127.0.0.1 {self.port}\n    priv_limit admin\n"
            "    allowed_auths_callback none md2 md5 straight\n    allowed_auths_user none md2 md5 straight\n"
            "    allowed_auths_operator none md2 md5 straight\n    allowed_auths_admin none md2 md5 straight\n"
            "    guid a123456789abcdefa123456789abcdef\n  endlan\n"
            f'  chassis_control "{script} 0x20"\n'
            f'  user 1 true "" "test" user 10 none md2 md5 straight\n'
            f'  user 2 true "{USER}" "{PASSWORD}" admin 10 none md2 md5 straight\n'
        )
        self.emu = tmp / "sim.emu"
        self.emu.write_text(
            "mc_setbmc 0x20\nmc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02 persist_sdr\nmc_enable 0x20\n"
        )
        self.proc: subprocess.Popen | None = None

    @property
    def power(self) -> str:
        return "on" if self.state.read_text().strip() == "1" else "off"

    def start(self) -> IpmiSim:
        self.proc = _spawn(
            [self.bin, "-c", str(self.lan), "-f", str(self.emu), "-s", str(self.tmp / "ipmisim-state"), "-n"],
            self.tmp / "ipmisim.log",
        )
        log = self.tmp / "ipmisim.log"
        eventually_sync(
            lambda: (
                ipmitool(self.port, "-R", "1", "-N", "1", "chassis", "power", "status").returncode == 0
                or _exited(self.proc, log)
            ),
            15,
            "ipmi_sim to answer",
            every=0.1,
            details=lambda: log.read_text()[-2000:],
        )
        return self

    def stop(self) -> None:
        stop(self.proc)


def make_tls(tmp: Path, *, host: str = "127.0.0.1") -> tuple[Path, Path, Path]:
    """(ca.pem, server.pem, server.key): a throw-away CA and a server certificate for ``host``."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "powerguard test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(host))]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    ca_pem, cert_pem, key_pem = tmp / "ca.pem", tmp / "server.pem", tmp / "server.key"
    ca_pem.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_pem.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_pem.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return ca_pem, cert_pem, key_pem


class SushyBmc:
    """sushy-emulator (fake driver) over TLS with basic auth; one system named ``name``."""

    def __init__(self, tmp: Path, name: str = "node1", *, power: str = "On", delay_s: int | None = 0) -> None:
        import bcrypt

        self.tmp, self.port, self.name = tmp, free_port(), name
        self.ca, cert, key = make_tls(tmp)
        htpasswd = tmp / "htpasswd"
        digest = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
        htpasswd.write_text(f"{USER}:{digest}\n")
        state = tmp / "sushy-state"
        state.mkdir(exist_ok=True)
        self.uuid = "5c4f2b62-6a5d-4b8e-9a8e-3b0c0b2c0d01"
        conf = tmp / "sushy.conf"
        systems = [{"uuid": self.uuid, "name": name, "power_state": power, "external_notifier": False, "nics": []}]
        conf.write_text(
            "SUSHY_EMULATOR_FAKE_DRIVER = True\n"
            f"SUSHY_EMULATOR_FAKE_SYSTEMS = {systems!r}\n"
            f"SUSHY_EMULATOR_AUTH_FILE = {str(htpasswd)!r}\n"
            f"SUSHY_EMULATOR_STATE_DIR = {str(state)!r}\n"
            "SUSHY_EMULATOR_LISTEN_IP = '127.0.0.1'\n"
            f"SUSHY_EMULATOR_LISTEN_PORT = {self.port}\n"
            f"SUSHY_EMULATOR_SSL_CERT = {str(cert)!r}\nSUSHY_EMULATOR_SSL_KEY = {str(key)!r}\n"
        )
        self.env = {"PG_SUSHY_DELAY_S": str(delay_s)} if delay_s is not None else {}
        self.argv = [sys.executable, str(HERE / "sushy_main.py"), "--config", str(conf), "--fake"]
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def power(self) -> str:
        import requests

        r = requests.get(
            f"{self.url}/redfish/v1/Systems/{self.uuid}", auth=(USER, PASSWORD), verify=str(self.ca), timeout=5
        )
        r.raise_for_status()
        return r.json()["PowerState"]

    def start(self) -> SushyBmc:
        self.proc = _spawn(self.argv, self.tmp / "sushy.log", env=self.env)
        log = self.tmp / "sushy.log"

        def answers() -> bool:
            try:
                self.power()
                return True
            except Exception:
                return _exited(self.proc, log)

        eventually_sync(answers, 30, "sushy-emulator to answer", every=0.2, details=lambda: log.read_text()[-2000:])
        return self

    def stop(self) -> None:
        stop(self.proc)


def _exited(proc, log) -> bool:
    """False while ``proc`` runs; raises (ending the wait at once) with its log when it exited."""
    if proc.poll() is None:
        return False
    raise RuntimeError(f"{proc.args[0]} exited ({proc.returncode}): {log.read_text()[-2000:]}")
