"""The net-snmp ``pass_persist`` protocol for test agents run by snmpd (not by pytest):
``serve(values, on_set)`` answers PING, get, getnext from ``values()`` ({oid: (type, value)}) and
hands a set to ``on_set(oid, type, value)`` (a reply such as "DONE" or "not-writable")."""

import sys
from collections.abc import Callable


def key(oid: str) -> tuple[int, ...]:
    return tuple(int(x) for x in oid.strip(".").split("."))


def serve(
    values: Callable[[], dict[str, tuple[str, str]]],
    on_set: Callable[[str, str, str], str] = lambda *_: "not-writable",
) -> None:
    for line in sys.stdin:
        cmd = line.strip()
        if not cmd:
            continue  # snmpd sends a blank line after a set
        if cmd == "PING":
            print("PONG", flush=True)
            continue
        oid = sys.stdin.readline().strip()
        if cmd == "set":
            typ, _, val = sys.stdin.readline().strip().partition(" ")
            print(on_set(oid, typ, val), flush=True)
            continue
        vals = values()
        if cmd == "get":
            hit = vals.get(oid)
        else:  # getnext
            nxt = sorted((k for k in vals if key(k) > key(oid)), key=key)
            oid = nxt[0] if nxt else None
            hit = vals.get(oid) if oid else None
        if hit is None:
            print("NONE", flush=True)
        else:
            print(oid, hit[0], hit[1], sep="\n", flush=True)
