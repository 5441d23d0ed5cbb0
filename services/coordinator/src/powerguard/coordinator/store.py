"""Saga records in the ``pg_sagas`` KV bucket, written with CAS on the revision of their head.

A small record is one value at ``saga.<id>``, as it always was. A large one (thousands of ranks)
is a head at ``saga.<id>`` plus parts at ``sagapart.<id>.<name-hash>.<generation>``
(:mod:`.record_parts`). A save writes the parts whose bytes changed under fresh keys first, then
the head with CAS; only then are the parts it replaced purged. So a reader or a crash always
sees a head whose parts exist, and a stale leader's parts are never referenced (its head write
fails). Parts that no head refers to (a writer died between the two) are collected when a leader
loads the open sagas.

Parts are stored zlib-compressed (a 100,000-rank record is 0.78 MB of JSON when it starts, 4.2
MB once every rank acked; a save writes about 4x less than its JSON); a part that is JSON as it
stands (an older writer) is read as it is.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import zlib
from hashlib import blake2b

from powerguard.bus import BusNames, CasConflict, Kv

from .record import SagaRecord
from .record_parts import MissingPart, PartLimits, SplitMemo, join, references, split
from .store_format import RecordEncoder, decode

log = logging.getLogger(__name__)
saga_key = BusNames.saga_key
_READ_TRIES = 3


def _digest(content: bytes) -> bytes:
    return blake2b(content, digest_size=16).digest()


def _pack(part: bytes) -> bytes:
    return zlib.compress(part, 1)


def _unpack(value: bytes) -> bytes:
    """A part's JSON: zlib-compressed (the first byte is 0x78), or JSON as written before."""
    return value if value[:1] in (b"{", b"[") else zlib.decompress(value)


def _name_hash(key: str) -> str:
    return key.rsplit(".", 2)[-2]


class SagaStore:
    def __init__(self, kv: Kv, *, limits: PartLimits | None = None) -> None:
        self.kv = kv
        self.limits = limits or PartLimits()
        self._parts: dict[str, dict[str, tuple[bytes, str]]] = {}  # saga -> name hash -> (digest, key)
        self._memo: dict[str, SplitMemo] = {}  # saga -> what its last split serialized
        self._encoders: dict[str, RecordEncoder] = {}  # saga -> its encoder (what it encoded last)
        self.last_write: dict[str, int] = {}  # figures of the last save: parts, bytes, head_bytes

    # ------------------------------------------------------------------ reading
    async def load(
        self, *, site: str | None = None, open_only: bool = False, collect: bool = False
    ) -> list[tuple[SagaRecord, int]]:
        """Records (with their head's revision), oldest first. ``collect``: also purge the parts
        of the loaded sagas that no head refers to (the leader does, once it leads)."""
        keys = await self.kv.keys()
        out = []
        for key in (k for k in keys if k.startswith("saga.")):
            got = await self._read(key, site=site, open_only=open_only)
            if got is not None:
                out.append(got)
        if collect:
            await self._collect(keys, [rec.saga_id for rec, _ in out])
        return sorted(out, key=lambda item: item[0].created_at)

    async def read(self, key: str) -> tuple[SagaRecord, int] | None:
        """One record by its head's key (with the head's revision), or None: gone or unreadable
        (logged)."""
        return await self._read(key, site=None, open_only=False)

    async def _read(self, key: str, *, site: str | None, open_only: bool) -> tuple[SagaRecord, int] | None:
        for _ in range(_READ_TRIES):
            entry = await self.kv.get(key)
            if entry is None:
                return None
            try:
                head = json.loads(entry.value)
            except ValueError as exc:
                log.error("unreadable saga record %s skipped: %s", key, exc)
                return None
            if not isinstance(head, dict):
                log.error("unreadable saga record %s skipped: not an object", key)
                return None
            if site is not None and head.get("site") != site:
                return None
            try:
                parts = await self._fetch(head)
            except MissingPart as exc:
                log.info("saga record %s changed while read (part %s gone): reading again", key, exc)
                continue
            except ValueError as exc:
                log.error("unreadable saga record %s skipped: %s", key, exc)
                return None
            try:
                rec = decode(join(head, parts))
            except ValueError as exc:
                log.error("unreadable saga record %s skipped: %s", key, exc)
                return None
            if open_only and rec.terminal:
                return None
            self._parts[rec.saga_id] = {_name_hash(k): (_digest(v), k) for k, v in parts.items()}
            return rec, entry.revision
        log.error("saga record %s skipped: its parts kept changing while read", key)
        return None

    async def live_parts(self, saga_id: str) -> set[str]:
        """The part keys the stored record of ``saga_id`` refers to (directly or through other
        parts): what must be in the bucket; any other ``sagapart.<id>.*`` key is garbage."""
        entry = await self.kv.get(saga_key(saga_id))
        if entry is None or not entry.value:
            return set()
        return set(await self._fetch(json.loads(entry.value)))

    async def _fetch(self, head: dict) -> dict[str, bytes]:
        parts: dict[str, bytes] = {}
        todo = references(head)
        while todo:
            got = await asyncio.gather(*(self.kv.get(k) for k in todo))
            nxt = []
            for k, entry in zip(todo, got, strict=True):
                if entry is None:
                    raise MissingPart(k)
                try:
                    parts[k] = _unpack(entry.value)
                except zlib.error as exc:
                    raise ValueError(f"saga record part {k} is neither JSON nor zlib: {exc}") from exc
                nxt += references(json.loads(parts[k]))
            todo = nxt
        return parts

    async def _collect(self, keys: list[str], saga_ids: list[str]) -> None:
        for sid in saga_ids:
            live = {k for _, k in self._parts.get(sid, {}).values()}
            prefix = BusNames.saga_parts_prefix(sid)
            stale = [k for k in keys if k.startswith(prefix) and k not in live]
            for k in stale:
                await self.kv.purge(k)
            if stale:
                log.info("saga %s: purged %d part(s) no head refers to", sid, len(stale))

    # ------------------------------------------------------------------ writing
    async def create(self, rec: SagaRecord) -> int:
        return await self._write(rec, None)

    async def save(self, rec: SagaRecord, revision: int) -> int:
        """CAS write; raises :class:`~powerguard.bus.CasConflict` when someone else wrote."""
        return await self._write(rec, revision)

    async def _write(self, rec: SagaRecord, revision: int | None) -> int:
        sid = rec.saga_id
        old = self._parts.get(sid, {})
        new: dict[str, tuple[bytes, str]] = {}
        generation = secrets.token_hex(4)  # unique per write: two writers never share a key

        def key_for(name: str, content: bytes) -> str:
            h = blake2b(name.encode(), digest_size=6).hexdigest()
            d = _digest(content)
            if h in old and old[h][0] == d:
                new[h] = old[h]
            else:
                new[h] = (d, BusNames.saga_part_key(sid, h, generation))
            return new[h][1]

        # the nodes' entries alone ("name":{"node":"name"}) bound the record's size from below:
        # a record surely above the inline limit is not serialized once more just to measure it
        size = sum(2 * len(n) + 14 for n in rec.nodes)
        data = self._encoders.setdefault(sid, RecordEncoder()).encode(rec)
        whole = json.dumps(data, separators=(",", ":")).encode() if size <= self.limits.inline_bytes else None
        if whole is not None and len(whole) <= self.limits.inline_bytes:
            body, parts = whole, {}
        else:
            memo = self._memo.setdefault(sid, SplitMemo())
            size = len(whole) if whole is not None else size
            head, parts = split(data, limits=self.limits, key_for=key_for, size=size, memo=memo)
            body = json.dumps(head, separators=(",", ":")).encode()
        kept = {k for _, k in old.values()}
        fresh = {k: _pack(v) for k, v in parts.items() if k not in kept}
        await asyncio.gather(*(self.kv.put(k, v) for k, v in fresh.items()))
        try:
            if revision is None:
                rev = await self.kv.create(saga_key(sid), body)
            else:
                rev = await self.kv.update(saga_key(sid), body, revision=revision)
        except CasConflict:
            await asyncio.gather(*(self.kv.purge(k) for k in fresh), return_exceptions=True)
            self._memo.pop(sid, None)
            self._encoders.pop(sid, None)
            raise
        self._parts[sid] = new
        if rec.terminal:  # written for the last time (or nearly): what made its saves cheap goes
            self._memo.pop(sid, None)
            self._encoders.pop(sid, None)
        live = {k for _, k in new.values()}
        await asyncio.gather(*(self.kv.purge(k) for k in kept - live))
        self.last_write = {
            "parts": len(parts),
            "parts_written": len(fresh),
            "bytes_written": len(body) + sum(len(v) for v in fresh.values()),
            "head_bytes": len(body),
            "largest_written": max([len(body), *(len(v) for v in fresh.values())]),
            "parts_json_bytes": sum(len(v) for v in parts.values()),
        }
        return rev
