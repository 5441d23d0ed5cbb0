"""The three patch types of ``PATCH``: JSON merge patch (RFC 7386), JSON patch (RFC 6902) and
strategic merge patch (lists merged by their Kubernetes merge key, ``$patch`` directives)."""

from __future__ import annotations

import copy
from typing import Any

from .errors import ApiError

MERGE = "application/merge-patch+json"
JSON = "application/json-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"

# list fields merged by a key in a strategic merge patch (Kubernetes' patchMergeKey); every
# other list is replaced whole (as node.spec.taints, whose Go type declares no merge strategy)
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "conditions": "type",
    "ports": "containerPort",
    "tolerations": None,
    "ownerReferences": "uid",
    "imagePullSecrets": "name",
    "addresses": "type",
}


def apply(kind: str, target: dict, patch: Any) -> dict:
    if kind == MERGE:
        if not isinstance(patch, dict):
            raise ApiError(400, "BadRequest", "a merge patch must be a JSON object")
        return merge(target, patch)
    if kind == JSON:
        if not isinstance(patch, list):
            raise ApiError(400, "BadRequest", "a JSON patch must be a JSON array of operations")
        return json_patch(target, patch)
    if kind == STRATEGIC:
        if not isinstance(patch, dict):
            raise ApiError(400, "BadRequest", "a strategic merge patch must be a JSON object")
        return strategic(target, patch)
    raise ApiError(
        415,
        "UnsupportedMediaType",
        f"the body of the request was in an unknown format - accepted media "
        f"types include: {JSON}, {MERGE}, {STRATEGIC}",
    )


def merge(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge(out.get(k), v)
    return out


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError(422, "Invalid", f"JSON pointer {path!r} does not start with /")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _walk(doc: Any, parts: list[str], path: str) -> Any:
    for p in parts:
        try:
            doc = doc[int(p)] if isinstance(doc, list) else doc[p]
        except (KeyError, IndexError, ValueError, TypeError):
            raise ApiError(
                422,
                "Invalid",
                f"the server rejected our request due to an error in our request: doc is missing path: {path!r}",
            ) from None
    return doc


def _add(doc: Any, parts: list[str], value: Any, path: str) -> Any:
    if not parts:
        return value
    parent = _walk(doc, parts[:-1], path)
    last = parts[-1]
    if isinstance(parent, list):
        if last == "-":
            parent.append(value)
        else:
            i = int(last)
            if i > len(parent):
                raise ApiError(422, "Invalid", f"index out of range in {path!r}")
            parent.insert(i, value)
    elif isinstance(parent, dict):
        parent[last] = value
    else:
        raise ApiError(422, "Invalid", f"cannot add at {path!r}")
    return doc


def _remove(doc: Any, parts: list[str], path: str) -> Any:
    parent = _walk(doc, parts[:-1], path)
    _walk(parent, parts[-1:], path)  # it must exist
    if isinstance(parent, list):
        parent.pop(int(parts[-1]))
    else:
        del parent[parts[-1]]
    return doc


def json_patch(target: dict, ops: list) -> dict:
    doc = copy.deepcopy(target)
    for op in ops:
        name, path = op.get("op"), op.get("path", "")
        parts = _pointer(path)
        if name == "add":
            doc = _add(doc, parts, copy.deepcopy(op.get("value")), path)
        elif name == "remove":
            doc = _remove(doc, parts, path)
        elif name == "replace":
            _walk(doc, parts, path)
            doc = _remove(doc, parts, path) if parts else doc
            doc = _add(doc, parts, copy.deepcopy(op.get("value")), path)
        elif name == "test":
            if _walk(doc, parts, path) != op.get("value"):
                raise ApiError(
                    422,
                    "Invalid",
                    f"the server rejected our request due to an error in our request: testing value {path} failed",
                )
        elif name in ("move", "copy"):
            src = op.get("from", "")
            value = copy.deepcopy(_walk(doc, _pointer(src), src))
            if name == "move":
                doc = _remove(doc, _pointer(src), src)
            doc = _add(doc, parts, value, path)
        else:
            raise ApiError(422, "Invalid", f"unexpected JSON patch operation {name!r}")
    return doc


def strategic(target: Any, patch: Any, field: str = "") -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if k.startswith("$setElementOrder/") or k == "$retainKeys":
            continue
        if k.startswith("$deleteFromPrimitiveList/"):
            name = k.split("/", 1)[1]
            out[name] = [x for x in out.get(name) or [] if x not in v]
            continue
        if v is None:
            out.pop(k, None)
        elif isinstance(v, list) and MERGE_KEYS.get(k) and isinstance(out.get(k), list):
            out[k] = _merge_list(out[k], v, MERGE_KEYS[k])
        elif isinstance(v, dict):
            out[k] = strategic(out.get(k), v, k)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _merge_list(have: list, patch: list, key: str) -> list:
    out = copy.deepcopy(have)
    for item in patch:
        if not isinstance(item, dict) or key not in item:
            if isinstance(item, dict) and item.get("$patch") == "replace":
                return [x for x in patch if x is not item]
            out.append(copy.deepcopy(item))
            continue
        at = next((i for i, x in enumerate(out) if isinstance(x, dict) and x.get(key) == item[key]), None)
        if item.get("$patch") == "delete":
            if at is not None:
                out.pop(at)
        elif at is None:
            out.append(strategic({}, item))
        else:
            out[at] = strategic(out[at], item)
    return out
