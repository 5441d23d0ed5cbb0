"""A thin typed wrapper over a JetStream KV bucket with CAS that raises :class:`CasConflict`."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from nats.js import errors as js_errors
from nats.js.kv import KeyValue
from pydantic import BaseModel

from .errors import CasConflict


@dataclass(frozen=True)
class KvEntry:
    key: str
    value: bytes
    revision: int

    def json(self) -> Any:
        return json.loads(self.value)


def _bytes(value: bytes | str | BaseModel | dict | list) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, BaseModel):
        return value.model_dump_json().encode()
    return json.dumps(value, sort_keys=True, default=str).encode()


class Kv:
    def __init__(self, kv: KeyValue, bucket: str) -> None:
        self.raw = kv
        self.bucket = bucket

    async def get(self, key: str) -> KvEntry | None:
        try:
            entry = await self.raw.get(key)
        except (js_errors.KeyNotFoundError, js_errors.KeyDeletedError):
            return None
        if entry.value is None:
            return None
        return KvEntry(key, entry.value, entry.revision or 0)

    async def put(self, key: str, value: Any) -> int:
        return await self.raw.put(key, _bytes(value))

    async def create(self, key: str, value: Any) -> int:
        """Write only if the key does not exist (or was deleted)."""
        try:
            return await self.raw.create(key, _bytes(value))
        except js_errors.KeyWrongLastSequenceError:
            raise CasConflict(self.bucket, key, 0) from None

    async def update(self, key: str, value: Any, *, revision: int) -> int:
        """Compare-and-set: write only if ``revision`` is still the latest."""
        try:
            return await self.raw.update(key, _bytes(value), last=revision)
        except js_errors.KeyWrongLastSequenceError:
            raise CasConflict(self.bucket, key, revision) from None

    async def delete(self, key: str) -> None:
        await self.raw.delete(key)

    async def purge(self, key: str) -> None:
        """Remove the key with all its history (one marker stays)."""
        await self.raw.purge(key)

    async def keys(self) -> list[str]:
        """Every live key. nats-py's listing can answer "no keys" while the bucket holds some:
        its watcher reads the consumer's pending count after the server may already have pushed
        every key, and then signals the end before the first one is handled (a coordinator
        taking over resumed no saga: the saga stayed open, unseen). So an empty answer is
        checked against the stream itself: its subjects, each key's newest message (a deleted
        key's is its marker)."""
        try:
            return sorted(await self.raw.keys())
        except js_errors.NoKeysError:
            pass
        pre = self.raw._pre  # "$KV.<bucket>."; nats-py keeps the stream and prefix private
        info = await self.raw._js.stream_info(self.raw._stream, subjects_filter=f"{pre}>")
        if not info.state.messages:
            return []
        candidates = sorted(s[len(pre) :] for s in (info.state.subjects or {}))
        live: list[str] = []
        for i in range(0, len(candidates), 256):  # bounded: a bucket may hold 100k keys
            batch = candidates[i : i + 256]
            got = await asyncio.gather(*(self.get(k) for k in batch))
            live += [k for k, entry in zip(batch, got, strict=True) if entry is not None]
        return live

    async def items(self) -> list[KvEntry]:
        out = []
        for key in await self.keys():
            entry = await self.get(key)
            if entry is not None:
                out.append(entry)
        return out
