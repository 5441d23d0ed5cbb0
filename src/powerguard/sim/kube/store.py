"""The API server's storage (etcd's part): objects with a cluster-wide ``resourceVersion``,
optimistic concurrency (409 on a stale one), a bounded history of changes that a watch resumes
from (410 Gone once its resourceVersion was compacted away), and an audit log of every write.

Pure bookkeeping with an injected clock; no I/O but the audit file."""

from __future__ import annotations

import asyncio
import collections
import copy
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from .errors import ApiError, conflict, not_found
from .resources import Resource

Key = tuple[str, str, str]  # (resource key, namespace, name)


def now_iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Change:
    rv: int
    type: str  # ADDED, MODIFIED, DELETED
    resource: Resource
    obj: dict


class Store:
    def __init__(self, *, clock: Callable[[], float], history: int = 1000, audit: Path | None = None) -> None:
        self.clock = clock
        self.rv = 100
        self.objects: dict[Key, dict] = {}
        self.history: collections.deque[Change] = collections.deque(maxlen=history)
        self.compacted = self.rv  # a watch from below this resourceVersion gets 410 Gone
        self.watchers: set[asyncio.Queue] = set()  # each open watch's feed (None: end it)
        self.audit_path = audit
        self.audit: list[dict] = []

    # ------------------------------------------------------------ reads
    def get(self, res: Resource, ns: str, name: str) -> dict:
        obj = self.objects.get((res.key, ns, name))
        if obj is None:
            raise not_found(res.key, name)
        return copy.deepcopy(obj)

    def find(self, res: Resource, ns: str, name: str) -> dict | None:
        obj = self.objects.get((res.key, ns, name))
        return copy.deepcopy(obj) if obj is not None else None

    def list(self, res: Resource, ns: str | None, match: Callable[[dict], bool] = lambda o: True) -> list[dict]:
        return [
            copy.deepcopy(o)
            for (k, n, _), o in sorted(self.objects.items(), key=lambda kv: kv[0])
            if k == res.key and (ns is None or n == ns) and match(o)
        ]

    def since(self, rv: int) -> list[Change]:
        """Changes after ``rv``; 410 Gone when they are no longer all kept."""
        if rv < self.compacted:
            raise ApiError(410, "Expired", f"too old resource version: {rv} ({self.compacted})")
        return [c for c in self.history if c.rv > rv]

    def compact(self) -> int:
        """Forget the history up to now (as etcd's compaction) and end every open watch: a watch
        resumed from an older resourceVersion gets 410 Gone and must list again."""
        self.history.clear()
        self.rv += 1
        self.compacted = self.rv
        for q in list(self.watchers):
            q.put_nowait(None)
        return len(self.watchers)

    # ------------------------------------------------------------ writes
    def _bump(self, type_: str, res: Resource, obj: dict) -> dict:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        if len(self.history) == self.history.maxlen:
            self.compacted = self.history[0].rv
        change = Change(self.rv, type_, res, copy.deepcopy(obj))
        self.history.append(change)
        for q in list(self.watchers):
            q.put_nowait(change)
        return obj

    def create(self, res: Resource, ns: str, obj: dict, *, generate: bool = True) -> dict:
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        name = meta.get("name")
        if not name:
            raise ApiError(
                422,
                "Invalid",
                f"{res.kind} is invalid: metadata.name: Required value: name or generateName is required",
            )
        if (res.key, ns, name) in self.objects:
            raise ApiError(
                409, "AlreadyExists", f'{res.key} "{name}" already exists', details={"name": name, "kind": res.plural}
            )
        if res.namespaced:
            meta["namespace"] = ns
        else:
            meta.pop("namespace", None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now_iso(self.clock())
        meta["generation"] = 1
        meta.pop("deletionTimestamp", None)
        obj["apiVersion"], obj["kind"] = res.api_version, res.kind
        self.objects[(res.key, ns, name)] = obj
        return copy.deepcopy(self._bump("ADDED", res, obj))

    def replace(self, res: Resource, ns: str, name: str, obj: dict, *, subresource: str = "") -> dict:
        """An update: a stale ``metadata.resourceVersion`` is a 409 Conflict; the main resource
        keeps the stored status, ``/status`` keeps everything but the status."""
        old = self.objects.get((res.key, ns, name))
        if old is None:
            raise not_found(res.key, name)
        want = (obj.get("metadata") or {}).get("resourceVersion")
        if want and want != old["metadata"]["resourceVersion"]:
            raise conflict(res.key, name)
        new = copy.deepcopy(obj)
        if "status" in res.subresources:
            if subresource == "status":
                new = {**copy.deepcopy(old), "status": new.get("status")}
                if new["status"] is None:
                    new.pop("status")
            elif "status" in old:
                new["status"] = copy.deepcopy(old["status"])
            else:
                new.pop("status", None)
        meta = new.setdefault("metadata", {})
        for k in ("uid", "creationTimestamp", "namespace", "name", "deletionTimestamp", "deletionGracePeriodSeconds"):
            if k in old["metadata"]:
                meta[k] = old["metadata"][k]
            else:
                meta.pop(k, None)
        meta["generation"] = old["metadata"].get("generation", 1) + (
            1 if subresource != "status" and new.get("spec") != old.get("spec") else 0
        )
        new["apiVersion"], new["kind"] = res.api_version, res.kind
        if new == {**old, "metadata": {**old["metadata"], "generation": meta["generation"]}}:
            return copy.deepcopy(old)  # nothing changed: no new resourceVersion, no event (as the API server)
        self.objects[(res.key, ns, name)] = new
        return copy.deepcopy(self._bump("MODIFIED", res, new))

    def mark_deleted(self, res: Resource, ns: str, name: str, grace_s: int) -> dict:
        """A graceful delete: the object stays, with its deletionTimestamp, until removed."""
        old = self.objects[(res.key, ns, name)]
        if "deletionTimestamp" in old["metadata"]:
            return copy.deepcopy(old)
        new = copy.deepcopy(old)
        new["metadata"]["deletionTimestamp"] = now_iso(self.clock() + grace_s)
        new["metadata"]["deletionGracePeriodSeconds"] = grace_s
        self.objects[(res.key, ns, name)] = new
        return copy.deepcopy(self._bump("MODIFIED", res, new))

    def remove(self, res: Resource, ns: str, name: str) -> dict:
        old = self.objects.pop((res.key, ns, name), None)
        if old is None:
            raise not_found(res.key, name)
        return copy.deepcopy(self._bump("DELETED", res, old))

    # ------------------------------------------------------------ audit
    def record(
        self, *, user: str, verb: str, res: Resource | None, ns: str, name: str, sub: str, code: int, detail: str = ""
    ) -> None:
        """One line per write request, in the shape of Kubernetes' audit.k8s.io/v1 Event."""
        entry = {
            "kind": "Event",
            "apiVersion": "audit.k8s.io/v1",
            "level": "Metadata",
            "stage": "ResponseComplete",
            "auditID": str(uuid.uuid4()),
            "verb": verb,
            "user": {"username": user},
            "objectRef": {
                "resource": res.plural if res else "",
                "apiGroup": res.group if res else "",
                "namespace": ns,
                "name": name,
                "subresource": sub,
            },
            "responseStatus": {"code": code},
            "requestReceivedTimestamp": datetime.fromtimestamp(self.clock(), UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "resourceVersion": str(self.rv),
            "annotations": {"powerguard.io/detail": detail} if detail else {},
        }
        self.audit.append(entry)
        if self.audit_path is not None:
            with open(self.audit_path, "a") as f:
                f.write(json.dumps(entry) + "\n")
