"""Label and field selectors as the API server reads them (``labelSelector=a=b,c in (x,y),!d``,
``fieldSelector=spec.nodeName=n1,status.phase!=Succeeded``)."""

from __future__ import annotations

import re
from collections.abc import Callable

from .errors import ApiError

Match = Callable[[dict], bool]
_SET = re.compile(r"^\s*([A-Za-z0-9_./-]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")
_EQ = re.compile(r"^\s*([A-Za-z0-9_./-]+)\s*(==|=|!=)\s*([A-Za-z0-9_.-]*)\s*$")
_EXISTS = re.compile(r"^\s*(!?)([A-Za-z0-9_./-]+)\s*$")


def _terms(text: str) -> list[str]:
    """Split at commas outside parentheses."""
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur)
    return out


def labels(text: str | None) -> Match:
    if not text:
        return lambda obj: True
    checks: list[Match] = []
    for term in _terms(text):
        if m := _SET.match(term):
            key, op, vals = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",") if v.strip()}
            if op == "in":
                checks.append(lambda o, k=key, v=vals: _labels(o).get(k) in v)
            else:
                checks.append(lambda o, k=key, v=vals: _labels(o).get(k) not in v)
        elif m := _EQ.match(term):
            key, op, val = m.groups()
            if op == "!=":
                checks.append(lambda o, k=key, v=val: _labels(o).get(k) != v)
            else:
                checks.append(lambda o, k=key, v=val: _labels(o).get(k) == v)
        elif m := _EXISTS.match(term):
            neg, key = m.groups()
            checks.append((lambda o, k=key: k not in _labels(o)) if neg else (lambda o, k=key: k in _labels(o)))
        else:
            raise ApiError(400, "BadRequest", f"unable to parse requirement: {term.strip()!r}")
    return lambda obj: all(c(obj) for c in checks)


FIELDS = {
    "metadata.name": lambda o: o["metadata"].get("name", ""),
    "metadata.namespace": lambda o: o["metadata"].get("namespace", ""),
    "spec.nodeName": lambda o: (o.get("spec") or {}).get("nodeName", ""),
    "spec.unschedulable": lambda o: str(bool((o.get("spec") or {}).get("unschedulable", False))).lower(),
    "status.phase": lambda o: (o.get("status") or {}).get("phase", ""),
    "involvedObject.name": lambda o: (o.get("involvedObject") or {}).get("name", ""),
    "involvedObject.kind": lambda o: (o.get("involvedObject") or {}).get("kind", ""),
    "reason": lambda o: o.get("reason", ""),
}


def fields(text: str | None, plural: str) -> Match:
    if not text:
        return lambda obj: True
    checks: list[Match] = []
    for term in _terms(text):
        m = _EQ.match(term)
        if not m or m.group(1) not in FIELDS:
            raise ApiError(400, "BadRequest", f'"{term.strip()}" is not a known field selector for {plural}')
        key, op, val = m.groups()
        get = FIELDS[key]
        checks.append((lambda o, g=get, v=val: g(o) != v) if op == "!=" else (lambda o, g=get, v=val: g(o) == v))
    return lambda obj: all(c(obj) for c in checks)


def _labels(obj: dict) -> dict:
    return obj.get("metadata", {}).get("labels") or {}


def match_label_selector(selector: dict | None, obj: dict) -> bool:
    """A ``metav1.LabelSelector`` (matchLabels, matchExpressions) against an object's labels."""
    if selector is None:
        return False
    have = _labels(obj)
    if any(have.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        k, op, vals = e["key"], e["operator"], e.get("values") or []
        if (op == "In" and have.get(k) not in vals) or (op == "NotIn" and have.get(k) in vals):
            return False
        if (op == "Exists" and k not in have) or (op == "DoesNotExist" and k in have):
            return False
    return True
