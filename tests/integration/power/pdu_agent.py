#!/usr/bin/env python3
"""snmpd pass_persist backend for tests: an APC rPDU whose outlet states live in a JSON
file ({"1": "on", "2": "off", ...}). SET rPDUOutletControlOutletCommand.<n> (1 on, 2 off,
3 reboot) switches an outlet; rPDUOutletStatusOutletState.<n> reads it (1 on, 2 off).
Every switch is appended to <state>.log with a timestamp. Run by snmpd, not by pytest."""

import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ups"))
from pass_persist import serve

STATE = sys.argv[1]
CONTROL = ".1.3.6.1.4.1.318.1.1.12.3.3.1.1.4"
STATUS = ".1.3.6.1.4.1.318.1.1.12.3.5.1.1.4"


def load() -> dict[str, str]:
    try:
        with open(STATE) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def save(state: dict[str, str]) -> None:
    with open(STATE + ".tmp", "w") as f:
        json.dump(state, f)
    os.replace(STATE + ".tmp", STATE)


def values(state: dict[str, str]) -> dict[str, tuple[str, str]]:
    out = {}
    for n, s in state.items():
        out[f"{CONTROL}.{n}"] = ("integer", "1" if s == "on" else "2")
        out[f"{STATUS}.{n}"] = ("integer", "1" if s == "on" else "2")
    return out


def on_set(oid: str, typ: str, val: str) -> str:
    if not oid.startswith(CONTROL + "."):
        return "not-writable"
    state = load()
    n = oid.rsplit(".", 1)[1]
    if n not in state:
        return "no-creation"
    if typ != "integer" or val not in ("1", "2", "3"):
        return "wrong-value"
    state[n] = "off" if val == "2" else "on"
    save(state)
    with open(STATE + ".log", "a") as f:
        f.write(f"{time.time():.6f} {n} {state[n]}\n")
    return "DONE"


if __name__ == "__main__":
    serve(lambda: values(load()), on_set)
