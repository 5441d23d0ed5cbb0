"""Which commands power-control has taken on, by idempotency key, in the ``pg_power`` KV
bucket: a redelivered command (the coordinator re-sends pending ones after a takeover,
JetStream redelivers unacked ones) finds its key and does nothing new on the device; a
command still ``running`` when power-control died is resumed at start."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import time
from dataclasses import dataclass
from typing import Any, Literal

from powerguard.bus import CasConflict, Kv

Status = Literal["running", "done", "failed"]
log = logging.getLogger(__name__)
_BAD = re.compile(r"[^-_=.a-zA-Z0-9/]")


def kv_key(idempotency_key: str) -> str:
    """A KV-safe key; keys with other characters get a digest so two never collide."""
    clean = _BAD.sub("_", idempotency_key).strip("./") or "_"
    if clean != idempotency_key:
        clean += "." + hashlib.blake2s(idempotency_key.encode(), digest_size=6).hexdigest()
    return clean.replace("/", ".")


@dataclass
class Entry:
    key: str
    status: Status
    event: dict[str, Any]
    revision: int


class Ledger:
    def __init__(self, kv: Kv, instance: str) -> None:
        self.kv = kv
        self.instance = instance

    async def claim(self, key: str, event: dict[str, Any]) -> Entry | None:
        """Take the command on; None when the key was seen before (a duplicate)."""
        value = {"key": key, "status": "running", "event": event, "owner": self.instance, "since": time.time()}
        try:
            rev = await self.kv.create(kv_key(key), value)
        except CasConflict:
            return None
        return Entry(key, "running", event, rev)

    async def get(self, key: str) -> dict[str, Any] | None:
        entry = await self.kv.get(kv_key(key))
        return entry.json() if entry is not None else None

    async def finish(self, key: str, status: Status, detail: str = "") -> None:
        old = await self.get(key) or {"key": key, "event": {}}
        await self.kv.put(kv_key(key), {**old, "status": status, "detail": detail, "finished": time.time()})

    async def unfinished(self) -> list[Entry]:
        out = []
        for item in await self.kv.items():
            value = item.json()
            if isinstance(value, dict) and value.get("status") == "running":
                out.append(Entry(value["key"], "running", value.get("event", {}), item.revision))
        return out

    async def ran(self, key: str, *, grace_s: float, wait_s: float, poll_s: float = 0.1) -> bool:
        """Whether the command ``key`` ran, waiting for it: up to ``grace_s`` for it to be taken
        on, ``wait_s`` for it to end. False when it never came, failed, did not end in time, or
        the bucket cannot be read (the caller does the work itself rather than wait blind).
        A node's shutdown asks this of its jobs' own stop (one command for all their nodes)."""
        start = time.monotonic()
        while True:
            try:
                entry = await self.get(key)
            except Exception as exc:
                log.warning("%s not readable (%s): taken as not run", key, exc)
                return False
            status = entry.get("status") if entry else None
            if status in ("done", "failed"):
                return status == "done"
            if time.monotonic() - start >= (wait_s if entry else grace_s):
                return False
            await asyncio.sleep(poll_s)
