"""The API's verbs over the store, with Kubernetes' semantics: graceful pod deletion, the
Eviction API's PodDisruptionBudget check (429 naming the budget), patches whose
resourceVersion is a precondition, ``dryRun=All``. The HTTP layer and the simulated controllers
both go through here, each under its own user (every write lands in the audit log)."""

from __future__ import annotations

from typing import Any

from . import patches
from .errors import ApiError
from .resources import BY_KIND, Resource
from .selectors import match_label_selector
from .store import Store

PODS = BY_KIND["Pod"]
PDBS = BY_KIND["PodDisruptionBudget"]
DEFAULT_GRACE_S = 30


class Api:
    def __init__(self, store: Store) -> None:
        self.store = store

    def _audit(
        self, user: str, verb: str, res: Resource, ns: str, name: str, sub: str = "", code: int = 200, detail: str = ""
    ) -> None:
        self.store.record(user=user, verb=verb, res=res, ns=ns, name=name, sub=sub, code=code, detail=detail)

    def create(self, user: str, res: Resource, ns: str, body: dict, *, dry_run: bool = False) -> dict:
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the body of the request must be a JSON object")
        body_ns = (body.get("metadata") or {}).get("namespace")
        if res.namespaced and body_ns and body_ns != ns:
            raise ApiError(
                400,
                "BadRequest",
                "the namespace of the provided object does not match the namespace sent on the request",
            )
        if res is PODS:  # the API server's defaults
            body = {**body, "status": {"phase": "Pending", "qosClass": "BestEffort"}}
        if dry_run:
            return body
        out = self.store.create(res, ns, body)
        self._audit(user, "create", res, ns, out["metadata"]["name"], code=201, detail=_detail(res, out))
        return out

    def update(
        self, user: str, res: Resource, ns: str, name: str, body: dict, *, sub: str = "", dry_run: bool = False
    ) -> dict:
        if (body.get("metadata") or {}).get("name") not in (None, name):
            raise ApiError(400, "BadRequest", "the name of the object does not match the name on the URL")
        if dry_run:
            return body
        out = self.store.replace(res, ns, name, body, subresource=sub)
        self._audit(user, "update", res, ns, name, sub, detail=_detail(res, out))
        return out

    def patch(
        self,
        user: str,
        res: Resource,
        ns: str,
        name: str,
        kind: str,
        body: Any,
        *,
        sub: str = "",
        dry_run: bool = False,
    ) -> dict:
        current = self.store.get(res, ns, name)
        patched = patches.apply(kind, current, body)
        if not isinstance(patched, dict):
            raise ApiError(422, "Invalid", "the patched object is not an object")
        if dry_run:
            return patched
        out = self.store.replace(res, ns, name, patched, subresource=sub)
        self._audit(user, "patch", res, ns, name, sub, detail=_detail(res, out))
        return out

    def delete(
        self, user: str, res: Resource, ns: str, name: str, *, grace_s: int | None = None, dry_run: bool = False
    ) -> dict:
        obj = self.store.get(res, ns, name)
        if dry_run:
            return obj
        if res is PODS and (obj.get("spec") or {}).get("nodeName") and grace_s != 0:
            grace = (
                grace_s if grace_s is not None else (obj["spec"].get("terminationGracePeriodSeconds", DEFAULT_GRACE_S))
            )
            out = self.store.mark_deleted(res, ns, name, int(grace))
        else:
            out = self.store.remove(res, ns, name)
        self._audit(user, "delete", res, ns, name)
        return out

    def evict(self, user: str, ns: str, name: str, body: dict, *, dry_run: bool = False) -> dict:
        """``POST pods/<name>/eviction``: refused with 429 while a PodDisruptionBudget selecting
        the pod allows no disruption (the budget named in the cause, as the API server does)."""
        pod = self.store.get(PODS, ns, name)
        if pod["metadata"].get("deletionTimestamp"):
            return _success()
        for pdb in self.store.list(
            PDBS, ns, lambda p: match_label_selector((p.get("spec") or {}).get("selector"), pod)
        ):
            if not _healthy(pod):
                continue  # an unready pod may always be evicted (unhealthyPodEvictionPolicy: AlwaysAllow)
            allowed, needs, has = disruptions_allowed(self.store, pdb)
            if allowed < 1:
                self._audit(
                    user, "create", PODS, ns, name, "eviction", 429, detail=f"refused by {pdb['metadata']['name']}"
                )
                raise ApiError(
                    429,
                    "TooManyRequests",
                    "Cannot evict pod as it would violate the pod's disruption budget.",
                    details={
                        "causes": [
                            {
                                "reason": "DisruptionBudget",
                                "message": f"The disruption budget "
                                f"{pdb['metadata']['name']} needs {needs} healthy pods and has {has} "
                                "currently",
                            }
                        ]
                    },
                )
        grace = ((body or {}).get("deleteOptions") or {}).get("gracePeriodSeconds")
        if not dry_run:
            self.delete(user, PODS, ns, name, grace_s=grace)
            self._audit(user, "create", PODS, ns, name, "eviction", 201)
        return _success()


def _success() -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}


def _healthy(pod: dict) -> bool:
    st = pod.get("status") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions", []))
    return st.get("phase") == "Running" and ready and not pod["metadata"].get("deletionTimestamp")


def disruptions_allowed(store: Store, pdb: dict) -> tuple[int, int, int]:
    """(disruptions allowed, healthy pods needed, healthy pods now) of a PodDisruptionBudget."""
    spec = pdb.get("spec") or {}
    pods = store.list(PODS, pdb["metadata"]["namespace"], lambda p: match_label_selector(spec.get("selector"), p))
    expected, healthy = len(pods), sum(1 for p in pods if _healthy(p))

    def count(v: Any) -> int:
        if isinstance(v, str) and v.endswith("%"):
            return -(-expected * int(v[:-1]) // 100)
        return int(v)

    if "minAvailable" in spec:
        needs = count(spec["minAvailable"])
    else:
        needs = expected - count(spec.get("maxUnavailable", 0))
    return healthy - needs, needs, healthy


def _detail(res: Resource, obj: dict) -> str:
    """What the audit line says of the object's new state (what a test reads the order from)."""
    spec = obj.get("spec") or {}
    if res.kind == "Node":
        taints = ",".join(f"{t['key']}:{t['effect']}" for t in spec.get("taints") or [])
        return f"taints=[{taints}]" + (" unschedulable" if spec.get("unschedulable") else "")
    if res.kind == "JobSet":
        return f"suspend={bool(spec.get('suspend'))}"
    if res.kind == "Workload":
        return f"active={spec.get('active', True)}"
    if res.kind == "ClusterQueue":
        return f"stopPolicy={spec.get('stopPolicy', 'None')}"
    if res.kind == "Event":
        return f"reason={obj.get('reason', '')}"
    return ""
