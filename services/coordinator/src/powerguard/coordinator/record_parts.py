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
import math
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from json.encoder import encode_basestring_ascii  # type: ignore[attr-defined]
from typing import Any

REF = "$parts"
TYPE = "$type"
LIT = "$lit"  # wraps a dict of the record that looks like a reference (or like such a wrapper)


def _lookalike(d: dict) -> bool:
    """A dict of the record that :func:`join` would take for a reference or a wrapper (its keys
    exactly ``{REF, TYPE}`` or ``{LIT}``: tested by membership, as this runs for every dict of a
    100k-rank record on every save)."""
    n = len(d)
    return (n == 1 and LIT in d) or (n == 2 and REF in d and TYPE in d)  # what join() takes apart


def _escaped(value: Any) -> Any:
    """``value`` with every lookalike dict wrapped in ``{LIT: ...}`` (the same object when none)."""
    if isinstance(value, dict):
        items = {k: _escaped(v) for k, v in value.items()}
        same = all(items[k] is v for k, v in value.items())
        out = value if same else items
        return {LIT: out} if _lookalike(value) else out
    if isinstance(value, list):
        items = [_escaped(v) for v in value]
        return value if all(a is b for a, b in zip(items, value, strict=True)) else items
    return value


@dataclass(frozen=True)
class PartLimits:
    inline_bytes: int = 96 * 1024  # a record at most this large is stored as one value
    container_bytes: int = 16 * 1024  # a larger dict or list goes into parts
    part_bytes: int = 64 * 1024  # the most one part holds (one item larger than this stays whole)


class MissingPart(KeyError):
    """A reference names a part that is not there (a writer replaced it meanwhile: read again)."""


_ENCODER = json.JSONEncoder(separators=(",", ":"))  # ASCII: characters are bytes


def _dumps(value: Any) -> str:
    """JSON text of a value; scalars without building an encoder (a 100k-rank record has
    hundreds of thousands of them, and this runs once per stored batch)."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if type(value) is int:
        return int.__repr__(value)
    if type(value) is str:
        return encode_basestring_ascii(value)
    if type(value) is float and math.isfinite(value):
        return float.__repr__(value)
    return _ENCODER.encode(value)


Chunk = tuple[tuple[Any, ...], str]  # (the items, their JSON text joined by commas)
_SCALARS = (str, int, float, bool, type(None))
_MEMO_MIN = 64  # a flat container with fewer items is simply serialized again
_BRACKETS = {"dict": ("{", "}"), "list": ("[", "]")}


@dataclass
class SplitMemo:
    """What one record's last split serialized, by path (kept by the caller between splits)."""

    chunks: dict[str, list[Chunk]] = field(default_factory=dict)  # large flat containers
    inline: dict[str, tuple[Any, str]] = field(default_factory=dict)  # containers kept whole, with their text
    # containers with parts in them: (the container, (its reference or smaller form, text), its parts)
    cut: dict[str, tuple[Any, tuple[Any, str], list[tuple[str, bytes, str]]]] = field(default_factory=dict)


def split(
    data: dict[str, Any],
    *,
    limits: PartLimits,
    key_for: Callable[[str, bytes], str],
    size: int | None = None,
    memo: SplitMemo | None = None,
) -> tuple[dict[str, Any], dict[str, bytes]]:
    """(head, parts by key) for a record's JSON form. ``key_for(name, content)`` names the key of
    the part called ``name`` (a path such as ``jobs/j1/acked#3``) holding ``content``. ``size``:
    the record's JSON size when the caller knows it (or a lower bound of it above the inline
    limit). ``memo`` (kept by the caller between splits of one record) holds the chunks of its
    large flat containers: a chunk whose items did not change is not serialized again, so a
    batch of acks costs what it added, not the record; a container that is the very object it
    was last time (the caller's encoder reuses what did not change) is not walked at all: its
    parts are named again as they were. So a caller keeping a memo never changes in place a
    container it passed before: a changed container is a new object."""
    if (size if size is not None else len(_dumps(data))) <= limits.inline_bytes:
        return _escaped(data), {}
    parts: dict[str, bytes] = {}
    emitted: list[tuple[str, bytes, str]] = []  # (name, content, key) of every part, in order
    memo = memo if memo is not None else SplitMemo()

    def flat(value: dict | list, path: str, is_dict: bool) -> list[Chunk] | None:
        """Chunks of a flat container's items: the memo's while their items are unchanged, then new
        (None: an item that is not a scalar: not a flat container). Only the new items are looked
        at one by one: the memo's were scalars and are equal to them. The memo's items are compared
        with the container's in one pass of its own iterator (no copy of a 100,000-item map)."""
        chunks: list[Chunk] = []
        pos, count = 0, len(value)
        it = iter(value.items()) if is_dict else iter(value)
        for its, body in memo.chunks.get(path, []):
            n = len(its)
            # map() takes the chunk's item first: it stops there, n items into the container
            if pos + n > count or not all(map(operator.eq, its, it)):
                rest = list(value.items())[pos:] if is_dict else value[pos:]  # (it stopped inside a chunk)
                break
            chunks.append((its, body))
            pos += n
        else:
            rest = list(it)
        head: tuple = ()
        texts: list[str] = []
        size_ = 2
        if chunks and rest and len(chunks[-1][1]) + 2 < limits.part_bytes * 3 // 4:
            head, body = chunks.pop()  # the last chunk has room: the appended items join it
            texts, size_ = [body], len(body) + 2
        taken: list = []
        for item in rest:
            if not isinstance(item[1] if is_dict else item, _SCALARS):
                return None
            text = f"{encode_basestring_ascii(str(item[0]))}:{_dumps(item[1])}" if is_dict else _dumps(item)
            if texts and size_ + len(text) + 1 > limits.part_bytes:
                chunks.append((head + tuple(taken), ",".join(texts)))
                head, taken, texts, size_ = (), [], [], 2
            texts.append(text)
            taken.append(item)
            size_ += len(text) + 1
        if texts:
            chunks.append((head + tuple(taken), ",".join(texts)))
        memo.chunks[path] = chunks
        return chunks

    def emit(bodies: list[str], path: str, kind: str) -> dict[str, Any]:
        """One part per body (items' JSON joined by commas); the reference that replaces them."""
        open_, close = _BRACKETS[kind]
        keys: list[str] = []
        for body in bodies:
            content = (open_ + body + close).encode()
            name = f"{path}#{len(keys)}"
            key = key_for(name, content)
            parts[key] = content
            emitted.append((name, content, key))
            keys.append(key)
        return {REF: keys, TYPE: kind}

    def cut(items: list[tuple[Any, str]], path: str, kind: str) -> dict[str, Any]:
        bodies: list[str] = []
        chunk: list[str] = []
        size = 2
        for _, text in items:
            if chunk and size + len(text) + 1 > limits.part_bytes:
                bodies.append(",".join(chunk))
                chunk, size = [], 2
            chunk.append(text)
            size += len(text) + 1
        if chunk:
            bodies.append(",".join(chunk))
        return emit(bodies, path, kind)

    def shrink_flat(value: dict | list, path: str) -> tuple[Any, str] | None:
        """A container of scalars (None: not such a container). A small one (a node's plan, a
        run of ranks: tens of thousands in a large saga) is serialized in one pass and kept
        whole unless too large; a large one goes through the memo's chunks."""
        is_dict = isinstance(value, dict)
        values = value.values() if is_dict else value
        if len(value) < _MEMO_MIN:
            if not all(isinstance(v, _SCALARS) for v in values):
                return None
            if is_dict:
                body = ",".join(f"{encode_basestring_ascii(str(k))}:{_dumps(v)}" for k, v in value.items())
                text = "{" + body + "}"
            else:
                text = "[" + ",".join(map(_dumps, value)) + "]"
            if len(text) + 1 > limits.container_bytes:
                return None  # too large to keep whole: walked and cut like any container
            if path:
                memo.inline[path] = (value, text)
            return value, text
        if not isinstance(next(iter(values)), _SCALARS):
            return None  # a table of containers (a saga's nodes): not looked at item by item here
        chunks = flat(value, path, is_dict)
        if chunks is None:
            return None
        kind = "dict" if is_dict else "list"
        if sum(len(b) + 1 for _, b in chunks) + 1 > limits.container_bytes and path:
            ref = emit([b for _, b in chunks], path, kind)
            return ref, _dumps(ref)
        open_, close = _BRACKETS[kind]
        return value, open_ + ",".join(b for _, b in chunks) + close

    def shrink(value: Any, path: str) -> tuple[Any, str]:
        """(value with large containers replaced, its JSON text); a container equal to the one
        at the same path last time (a node's plan that did not change) is not walked again."""
        if isinstance(value, dict) and _lookalike(value):  # wrapped, never cut (two items at most)
            items = [
                (k, *(shrink(v, f"{path}/{k}") if isinstance(v, dict | list) else (v, _dumps(v))))
                for k, v in value.items()
            ]
            body = ",".join(f"{encode_basestring_ascii(k)}:{t}" for k, _, t in items)
            return {LIT: {k: small for k, small, _ in items}}, f'{{"{LIT}":{{{body}}}}}'
        same = memo.inline.get(path)
        if same is not None and (same[0] is value or same[0] == value):
            return same
        was = memo.cut.get(path)
        if was is not None and was[0] is value and reuse(was[2]):
            return was[1]
        start = len(emitted)
        if isinstance(value, dict | list) and (done := shrink_flat(value, path)) is not None:
            pass
        else:
            done = _shrink(value, path)
        if done[0] is value:
            if path:
                memo.inline[path] = done  # kept whole: remember it with its text
        elif path:
            memo.cut[path] = (value, done, emitted[start:])
        return done

    def reuse(named: list[tuple[str, bytes, str]]) -> bool:
        """Name the parts of an unchanged container again; False (nothing named) when a part's
        key is no longer the one its reference holds (the caller's key table was replaced)."""
        if any(key_for(name, content) != key for name, content, key in named):
            return False
        for name, content, key in named:
            parts[key] = content
            emitted.append((name, content, key))
        return True

    def _shrink(value: Any, path: str) -> tuple[Any, str]:
        if isinstance(value, dict):
            items = []
            for k, v in value.items():
                small, text = shrink(v, f"{path}/{k}") if isinstance(v, dict | list) else (v, _dumps(v))
                items.append(((k, small), f"{encode_basestring_ascii(str(k))}:{text}"))
            total = sum(len(t) + 1 for _, t in items) + 1
            if total > limits.container_bytes and path:
                ref = cut(items, path, "dict")
                return ref, _dumps(ref)
            text = "{" + ",".join(t for _, t in items) + "}"
            if all(small is value[k] for (k, small), _ in items):
                return value, text  # nothing inside was cut
            return {k: v for (k, v), _ in items}, text
        if isinstance(value, list):
            items = [
                shrink(v, f"{path}/{i}") if isinstance(v, dict | list) else (v, _dumps(v)) for i, v in enumerate(value)
            ]
            total = sum(len(t) + 1 for _, t in items) + 1
            if total > limits.container_bytes:
                ref = cut(items, path, "list")
                return ref, _dumps(ref)
            text = "[" + ",".join(t for _, t in items) + "]"
            if all(small is v for (small, _), v in zip(items, value, strict=True)):
                return value, text
            return [v for v, _ in items], text
        return value, _dumps(value)

    head, _ = shrink(data, "")
    return head, parts


def references(value: Any) -> list[str]:
    """Every part key a head (or a part) refers to directly."""
    out: list[str] = []
    if isinstance(value, dict):
        if value.keys() == {LIT}:
            return references(value[LIT])
        if value.keys() == {REF, TYPE}:
            return list(value[REF])
        for v in value.values():
            out += references(v)
    elif isinstance(value, list):
        for v in value:
            out += references(v)
    return out


def join(head: dict[str, Any], parts: Mapping[str, bytes]) -> dict[str, Any]:
    """The record's JSON form back from its head and parts; raises :class:`MissingPart`."""

    def resolve(ref: dict[str, Any]) -> Any:
        """A reference's container, its chunks merged (their values not filled yet)."""
        chunks = []
        for key in ref[REF]:
            if key not in parts:
                raise MissingPart(key)
            chunks.append(json.loads(parts[key]))
        if ref.get(TYPE) == "list":
            return [v for c in chunks for v in c]
        return {k: v for c in chunks for k, v in c.items()}

    def children(value: Any) -> Any:
        """A container of the record as it is (never taken for a reference), its children filled."""
        if isinstance(value, dict):
            return {k: fill(v) for k, v in value.items()}
        if isinstance(value, list):
            return [fill(v) for v in value]
        return value

    def fill(value: Any) -> Any:
        if isinstance(value, dict):
            if value.keys() == {LIT}:  # a dict of the record that looked like a reference: as it is
                return children(value[LIT])
            if value.keys() == {REF, TYPE}:
                return children(resolve(value))
        return children(value)

    return fill(head)
