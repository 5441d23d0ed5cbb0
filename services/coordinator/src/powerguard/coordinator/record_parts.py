"""A saga record as one head value plus bounded parts, so that no KV value nears NATS's payload
limit however many ranks and nodes a saga holds (pure: no I/O).

:func:`split` walks the record's JSON form bottom-up; a dict or list whose JSON is larger than
``limits.container_bytes`` is cut, in order, into chunks of at most ``limits.part_bytes`` and
replaced in its parent by a reference ``{"$parts": [key, ...], "$type": "dict"|"list"}``. The
caller names each chunk's key (``key_for``), so it can keep the key of a chunk whose bytes did
not change. Dicts keep insertion order, so an ack that adds a rank changes only the last chunk.
:func:`join` puts the references back. A record below ``limits.inline_bytes`` stays one value,
byte for byte the JSON it always was.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

REF = "$parts"
TYPE = "$type"


@dataclass(frozen=True)
class PartLimits:
    inline_bytes: int = 96 * 1024  # a record at most this large is stored as one value
    container_bytes: int = 16 * 1024  # a larger dict or list goes into parts
    part_bytes: int = 64 * 1024  # the most one part holds (one item larger than this stays whole)


class MissingPart(KeyError):
    """A reference names a part that is not there (a writer replaced it meanwhile: read again)."""


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))  # ASCII: characters are bytes


def split(
    data: dict[str, Any], *, limits: PartLimits, key_for: Callable[[str, bytes], str]
) -> tuple[dict[str, Any], dict[str, bytes]]:
    """(head, parts by key) for a record's JSON form. ``key_for(name, content)`` names the key of
    the part called ``name`` (a path such as ``jobs/j1/acked#3``) holding ``content``."""
    if len(_dumps(data)) <= limits.inline_bytes:
        return data, {}
    parts: dict[str, bytes] = {}

    def cut(items: list[tuple[Any, str]], path: str, kind: str) -> dict[str, Any]:
        keys: list[str] = []
        open_, close = ("{", "}") if kind == "dict" else ("[", "]")

        def flush(texts: list[str]) -> None:
            content = (open_ + ",".join(texts) + close).encode()
            key = key_for(f"{path}#{len(keys)}", content)
            parts[key] = content
            keys.append(key)

        chunk: list[str] = []
        size = 2
        for _, text in items:
            if chunk and size + len(text) + 1 > limits.part_bytes:
                flush(chunk)
                chunk, size = [], 2
            chunk.append(text)
            size += len(text) + 1
        if chunk:
            flush(chunk)
        return {REF: keys, TYPE: kind}

    def shrink(value: Any, path: str) -> tuple[Any, str]:
        """(value with large containers replaced, its JSON text)."""
        if isinstance(value, dict):
            items = []
            for k, v in value.items():
                small, text = shrink(v, f"{path}/{k}")
                items.append(((k, small), f"{_dumps(str(k))}:{text}"))
            total = sum(len(t) + 1 for _, t in items) + 1
            if total > limits.container_bytes and path:
                ref = cut(items, path, "dict")
                return ref, _dumps(ref)
            out = {k: v for (k, v), _ in items}
            return out, "{" + ",".join(t for _, t in items) + "}"
        if isinstance(value, list):
            items = [shrink(v, f"{path}/{i}") for i, v in enumerate(value)]
            total = sum(len(t) + 1 for _, t in items) + 1
            if total > limits.container_bytes:
                ref = cut(items, path, "list")
                return ref, _dumps(ref)
            return [v for v, _ in items], "[" + ",".join(t for _, t in items) + "]"
        return value, _dumps(value)

    head, _ = shrink(data, "")
    return head, parts


def references(value: Any) -> list[str]:
    """Every part key a head (or a part) refers to directly."""
    out: list[str] = []
    if isinstance(value, dict):
        if REF in value:
            return list(value[REF])
        for v in value.values():
            out += references(v)
    elif isinstance(value, list):
        for v in value:
            out += references(v)
    return out


def join(head: dict[str, Any], parts: Mapping[str, bytes]) -> dict[str, Any]:
    """The record's JSON form back from its head and parts; raises :class:`MissingPart`."""

    def fill(value: Any) -> Any:
        if isinstance(value, dict):
            if REF in value:
                chunks = []
                for key in value[REF]:
                    if key not in parts:
                        raise MissingPart(key)
                    chunks.append(json.loads(parts[key]))
                if value.get(TYPE) == "list":
                    return [fill(v) for c in chunks for v in c]
                return {k: fill(v) for c in chunks for k, v in c.items()}
            return {k: fill(v) for k, v in value.items()}
        if isinstance(value, list):
            return [fill(v) for v in value]
        return value

    return fill(head)
