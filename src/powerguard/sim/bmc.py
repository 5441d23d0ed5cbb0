"""A simulated IPMI 2.0 BMC (pyghmi's BMC server) for one node, in its own process.

    python -m powerguard.sim.bmc --port 9623 --user admin --password-file pw --state node1.json

It serves real RMCP+ (``ipmitool -I lanplus -C 3`` and pyghmi work against it): chassis
power on/off/cycle/reset/soft-off (ACPI, honoured after ``--soft-off-delay`` unless
``--ignore-acpi``), power-on after ``--boot-delay``, and the chassis power-restore policy
(Get Chassis Status bits 5-6, Set Power Restore Policy). The power state lives in the JSON
``--state`` file (written atomically) so a simulated site can act on it.

``--ac-restored``: the BMC starts because its node's AC power came back after a blackout. The
node lost its power with it (``on`` in the state file becomes ``off``), then the restore policy
decides, as a real chassis does: always-on boots it (after ``--boot-delay``), previous boots it
when it was on when the power went, always-off leaves it off.

``--garble-sessions N``: the first N sessions are set up with a wrong key (the RAKP 2 message's
HMAC does not verify: ``ipmitool`` says "RAKP 2 HMAC is invalid"), as a BMC out of session
slots or confused by two sessions of one client does under load; later sessions work.

Two pyghmi server bugs are worked around: it offers cipher suite 17 but cannot do it (so an
open-session request for anything but SHA1 is refused and the client falls back), and it
never answers an unknown user (answered here with RAKP2 status 0x0d, unauthorized name).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

import pyghmi.ipmi.bmc as bmc
import pyghmi.ipmi.private.constants as constants
import pyghmi.ipmi.private.serversession as serversession

_POLICIES = {0: "always-off", 1: "previous", 2: "always-on"}


class _Session(serversession.ServerSession):
    garble_left = 0  # sessions still to set up with a wrong key (--garble-sessions)
    garble_log = ""  # where each garbled session is noted (the BMC's event log)

    def create_open_session_response(self, request):
        request = bytearray(request)
        if len(request) > 12 and request[12] != 1:  # only RAKP-HMAC-SHA1 works in pyghmi's server
            self.clientsessionid = request[4:8]
            self.managedsessionid = os.urandom(4)
            return bytearray([request[0], 0x11, 0, 0]) + self.clientsessionid
        return super().create_open_session_response(request)

    def _got_rakp1(self, data):
        namelen = data[27] if len(data) > 27 else 0
        name = bytes(data[28 : 28 + namelen]).decode("utf-8", "replace")
        if namelen and self.authdata.get(name) is None:
            reply = bytearray([data[0], 0x0D, 0, 0]) + self.clientsessionid
            self.send_payload(reply, constants.payload_types["rakp2"], retry=False)
            return
        if namelen and _Session.garble_left > 0:
            _Session.garble_left -= 1
            self.authdata = {**self.authdata, name: "garbled-" + self.authdata[name]}  # this session only
            with open(_Session.garble_log, "a") as f:
                f.write(f"{time.time():.6f} session garbled\n")
        super()._got_rakp1(data)


serversession.ServerSession = _Session  # the server module creates sessions by this name


class SimBmc(bmc.Bmc):
    def __init__(
        self,
        authdata,
        port,
        *,
        state: Path,
        boot_delay: float,
        soft_off_delay: float,
        ignore_acpi: bool,
        address: str = "127.0.0.1",
        ac_restored: bool = False,
    ):
        super().__init__(authdata, port=port, address=address)
        self.state_file = state
        self.boot_delay = boot_delay
        self.soft_off_delay = soft_off_delay
        self.ignore_acpi = ignore_acpi
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        if state.exists():
            self.state = json.loads(state.read_text())
        else:
            self.state = {"power": "on", "policy": 2, "changes": 0}
            self._save()
        if ac_restored:
            self._ac_restored()

    def _ac_restored(self) -> None:
        was_on = self.state["power"] == "on"
        if was_on:
            self._set("off")
        self._log(f"AC power restored (restore policy {_POLICIES.get(self.state.get('policy', 2))})")
        policy = self.state.get("policy", 2)
        if policy == 2 or (policy == 1 and was_on):
            self._set("on", self.boot_delay)

    def _save(self) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state))
        os.replace(tmp, self.state_file)

    def _set(self, power: str, after: float = 0.0) -> None:
        def apply() -> None:
            with self._lock:
                if self.state["power"] != power:
                    self.state["power"] = power
                    self.state["changes"] = self.state.get("changes", 0) + 1
                    self._save()
                    self._log(f"power {power}")

        if self._timer is not None:
            self._timer.cancel()
        if after <= 0:
            apply()
        else:
            self._timer = threading.Timer(after, apply)
            self._timer.daemon = True
            self._timer.start()

    def _log(self, what: str) -> None:
        with open(str(self.state_file) + ".log", "a") as f:
            f.write(f"{time.time():.6f} {what}\n")

    def get_power_state(self):
        return self.state["power"]

    def power_on(self):
        self._log("command on")
        self._set("on", self.boot_delay)

    def power_off(self):
        self._log("command off")
        self._set("off")

    def power_shutdown(self):
        self._log("command soft-off")
        if not self.ignore_acpi and self.state["power"] == "on":
            self._set("off", self.soft_off_delay)

    def power_cycle(self):
        self._log("command cycle")
        self._set("off")
        self._set("on", self.boot_delay)

    def power_reset(self):
        return None  # a reset keeps the power on

    def get_chassis_status(self, session):
        power = 1 if self.state["power"] == "on" else 0
        session.send_ipmi_response(data=[power | (self.state.get("policy", 2) << 5), 0, 0, 0])

    def handle_raw_request(self, request, session):
        if request["netfn"] == 0 and request["command"] == 6:  # set power restore policy
            code = request["data"][0] & 0b111 if request["data"] else 3
            if code in _POLICIES:
                with self._lock:
                    self.state["policy"] = code
                    self._save()
            elif code != 3:  # 3 = no change, just report what is supported
                return session.send_ipmi_response(code=0xCC)
            return session.send_ipmi_response(data=[0b111])  # all three policies supported
        return super().handle_raw_request(request, session)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m powerguard.sim.bmc", description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, required=True, help="UDP port")
    p.add_argument("--listen", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--user", default="admin")
    p.add_argument("--password-file", type=Path, required=True, help="File holding the password")
    p.add_argument("--state", type=Path, required=True, help="JSON file holding the power state")
    p.add_argument("--boot-delay", type=float, default=0.5, help="Seconds from power-on to 'on'")
    p.add_argument("--soft-off-delay", type=float, default=0.5, help="Seconds from ACPI shutdown to 'off'")
    p.add_argument("--ignore-acpi", action="store_true", help="Never honour a soft-off (a hung OS)")
    p.add_argument(
        "--ac-restored",
        action="store_true",
        help="Start as after a blackout: the node lost power; its restore policy decides whether it boots",
    )
    p.add_argument(
        "--garble-sessions",
        type=int,
        default=0,
        help="Set the first N sessions up with a wrong key (RAKP 2 HMAC is invalid), as a BMC under load does",
    )
    args = p.parse_args(argv)
    _Session.garble_left = args.garble_sessions
    _Session.garble_log = str(args.state) + ".log"
    password = args.password_file.read_text().strip()
    server = SimBmc(
        {args.user: password},
        args.port,
        state=args.state,
        boot_delay=args.boot_delay,
        soft_off_delay=args.soft_off_delay,
        ignore_acpi=args.ignore_acpi,
        address=args.listen,
        ac_restored=args.ac_restored,
    )
    print(f"bmc listening on {args.listen}:{args.port}", flush=True)
    try:
        server.listen(timeout=30)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
