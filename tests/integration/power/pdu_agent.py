#!/usr/bin/env python3
"""snmpd pass_persist backend for tests: an APC rPDU whose outlet states live in a JSON
file ({"1": "on", "2": "off", ...}). SET rPDUOutletControlOutletCommand.<n> (1 on, 2 off,
3 reboot) switches an outlet; rPDUOutletStatusOutletState.<n> reads it (1 on, 2 off).
Every switch is appended to <state>.log with a timestamp. Run by snmpd, not by pytest."""

import json
import os
import sys
import time

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


def key(oid: str) -> tuple[int, ...]:
    return tuple(int(x) for x in oid.strip(".").split("."))


def main() -> None:
    for line in sys.stdin:
        cmd = line.strip()
        if not cmd:
            continue  # snmpd sends a blank line after a set
        if cmd == "PING":
            print("PONG", flush=True)
            continue
        oid = sys.stdin.readline().strip()
        state = load()
        vals = values(state)
        if cmd == "set":
            typ_val = sys.stdin.readline().split()
            if not oid.startswith(CONTROL + "."):
                print("not-writable", flush=True)
                continue
            n = oid.rsplit(".", 1)[1]
            if n not in state:
                print("no-creation", flush=True)
                continue
            if len(typ_val) != 2 or typ_val[0] != "integer" or typ_val[1] not in ("1", "2", "3"):
                print("wrong-value", flush=True)
                continue
            state[n] = "off" if typ_val[1] == "2" else "on"
            save(state)
            with open(STATE + ".log", "a") as f:
                f.write(f"{time.time():.6f} {n} {state[n]}\n")
            print("DONE", flush=True)
            continue
        if cmd == "get":
            hit = vals.get(oid)
        else:
            nxt = sorted((k for k in vals if key(k) > key(oid)), key=key)
            oid = nxt[0] if nxt else None
            hit = vals.get(oid) if oid else None
        if hit is None:
            print("NONE", flush=True)
        else:
            print(oid, hit[0], hit[1], sep="\n", flush=True)


if __name__ == "__main__":
    main()
