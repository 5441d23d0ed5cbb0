"""A real apcupsd (Debian package), UPSTYPE snmp against the test snmpd's APC profile, with its
Network Information Server on a free loopback port."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.conftest import require_binary
from tests.waiting import eventually_sync

from .nut_peer import free_port
from .snmp_peer import SnmpUps


class Apcupsd:
    def __init__(self, tmp: Path, snmp: SnmpUps) -> None:
        # apcupsd conflicts with NUT in Debian: CI unpacks it and names it in POWERGUARD_APCUPSD
        self.binary = os.environ.get("POWERGUARD_APCUPSD") or require_binary("apcupsd", "apcupsd")
        self.tmp, self.port = tmp, free_port()
        self.conf = tmp / "apcupsd.conf"
        self.conf.write_text(
            "## apcupsd.conf v1.1 ##\n"
            f"UPSNAME testups\nUPSCABLE ether\nUPSTYPE snmp\nDEVICE 127.0.0.1:{snmp.port}:APC:public\n"
            f"POLLTIME 1\nLOCKFILE {tmp}\nSCRIPTDIR {tmp}\nPWRFAILDIR {tmp}\nNOLOGINDIR {tmp}\n"
            f"NETSERVER on\nNISIP 127.0.0.1\nNISPORT {self.port}\n"
            f"EVENTSFILE {tmp}/apcupsd.events\nSTATFILE {tmp}/apcupsd.status\n"
            # never act on the machine running the tests
            "ONBATTERYDELAY 3600\nBATTERYLEVEL 0\nMINUTES 0\nTIMEOUT 0\nANNOY 0\n"
        )
        self.proc: subprocess.Popen | None = None

    def start(self) -> Apcupsd:
        log = open(self.tmp / "apcupsd.log", "ab")
        self.proc = subprocess.Popen(
            [self.binary, "-b", "-f", str(self.conf), "-P", str(self.tmp / "apcupsd.pid")],
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        import socket

        def listening() -> bool:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return True
            except OSError:
                return False

        log = self.tmp / "apcupsd.log"
        eventually_sync(listening, 15, "apcupsd's NIS port", every=0.1, details=lambda: log.read_text()[-2000:])
        return self

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
