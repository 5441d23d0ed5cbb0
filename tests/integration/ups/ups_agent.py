#!/usr/bin/env python3
"""snmpd pass_persist backend for tests: a UPS (RFC 1628 UPS-MIB and APC PowerNet) whose
values come from a JSON state file the test rewrites. Run by snmpd, not by pytest."""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pass_persist import serve

STATE = sys.argv[1]
UPS = ".1.3.6.1.2.1.33"
APC = ".1.3.6.1.4.1.318"


def values() -> dict[str, tuple[str, str]]:
    try:
        with open(STATE) as f:
            s = json.load(f)
    except (OSError, ValueError):
        return {}
    on_battery = s.get("on_battery", False)
    out = {
        f"{UPS}.1.2.1.0": ("integer", "3" if s.get("low_battery") else "2"),  # upsBatteryStatus
        f"{UPS}.1.2.2.0": ("integer", str(s.get("seconds_on_battery", 0))),  # upsSecondsOnBattery
        f"{UPS}.1.2.3.0": ("integer", str(int(s.get("runtime_s", 1800) // 60))),  # upsEstimatedMinutesRemaining
        f"{UPS}.1.2.4.0": ("integer", str(s.get("charge", 100))),  # upsEstimatedChargeRemaining
        f"{UPS}.1.3.3.1.3.1": ("integer", str(s.get("input_v", 0 if on_battery else 230))),  # upsInputVoltage
        f"{UPS}.1.4.1.0": ("integer", "5" if on_battery else "3"),  # upsOutputSource
        f"{UPS}.1.4.4.1.5.1": ("integer", str(s.get("load", 40))),  # upsOutputPercentLoad
        f"{APC}.1.1.1.2.2.1.0": ("gauge", str(s.get("charge", 100))),  # upsAdvBatteryCapacity
        f"{APC}.1.1.1.2.2.3.0": ("timeticks", str(int(s.get("runtime_s", 1800) * 100))),  # RunTimeRemaining
        f"{APC}.1.1.1.4.1.1.0": ("integer", "3" if on_battery else "2"),  # upsBasicOutputStatus
        f"{APC}.1.1.1.4.2.3.0": ("gauge", str(s.get("load", 40))),  # upsAdvOutputLoad
        f"{APC}.1.1.1.3.2.1.0": ("gauge", str(s.get("input_v", 0 if on_battery else 230))),  # upsAdvInputLineVoltage
        f"{APC}.1.1.1.2.1.1.0": ("integer", "3" if s.get("low_battery") else "2"),  # upsBasicBatteryStatus
    }
    for oid in s.get("missing", []):
        out.pop(oid, None)
    for oid, (typ, val) in s.get("override", {}).items():
        out[oid] = (typ, val)
    return out


if __name__ == "__main__":
    serve(values)
