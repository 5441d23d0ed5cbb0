"""Pure rules of the Kubernetes adapter over plain objects (dicts as the API returns them):
taint lists, the workload a pod belongs to, the ClusterQueue hold, the Events it records."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

ON_BATTERY = "powerguard.io/on-battery"
UPS_LABEL = "powerguard.io/ups"  # a node's UPS as the cluster's admins label it (checked against the site file)
OUT_OF_SERVICE = "node.kubernetes.io/out-of-service"
OUT_OF_SERVICE_VALUE = "powerguard"  # ours: removed when the node is back; anyone else's is left alone
SUSPENDED_BY = "powerguard.io/suspended-by"
HELD_BY = "powerguard.io/held-by"
PREVIOUS_STOP_POLICY = "powerguard.io/previous-stop-policy"
# the kinds a pod's controller chain is followed through, bottom up; the top one is suspended
CHAIN_KINDS = ("Job", "JobSet", "TrainJob")
SUSPENDABLE = ("JobSet", "TrainJob")


def with_taint(taints: list[dict], key: str, value: str, effect: str) -> list[dict] | None:
    """The node's taints with ours added (None: already there, nothing to write)."""
    if any(t.get("key") == key and t.get("effect") == effect for t in taints):
        return None
    return [*taints, {"key": key, "value": value, "effect": effect}]


def without_taints(taints: list[dict], drop: list[tuple[str, str | None]]) -> list[dict] | None:
    """The node's taints without each (key, value) of ``drop`` (value None: any value); None
    when none of them is there."""
    kept = [t for t in taints if not any(t.get("key") == k and (v is None or t.get("value") == v) for k, v in drop)]
    return kept if len(kept) != len(taints) else None


def controller(obj: dict) -> dict | None:
    """The ownerReference with ``controller: true`` (what owns and recreates this object)."""
    return next((o for o in obj.get("metadata", {}).get("ownerReferences") or [] if o.get("controller")), None)


def holders(cq: dict) -> list[str]:
    """The sagas whose hold of this ClusterQueue is ours to lift (its ``held-by`` annotation:
    comma-separated saga ids; absent: we hold nothing there)."""
    notes = cq.get("metadata", {}).get("annotations") or {}
    return [s for s in (notes.get(HELD_BY) or "").split(",") if s]


def hold_patch(cq: dict, saga_id: str) -> dict | None:
    """The merge patch that holds a ClusterQueue's admission for this outage as well (None: this
    saga holds it already, or its owner does: a hold we did not place is never lifted by us). A
    hold belongs to every saga that placed it: a second outage's saga joins the first's."""
    spec = cq.get("spec") or {}
    sagas = holders(cq)
    if saga_id in sagas:
        return None
    if sagas:  # ours already, for another outage: this saga holds it too
        return {"metadata": {"annotations": {HELD_BY: ",".join(sorted({*sagas, saga_id}))}}}
    if spec.get("stopPolicy", "None") != "None":
        return None
    return {
        "metadata": {"annotations": {HELD_BY: saga_id, PREVIOUS_STOP_POLICY: spec.get("stopPolicy", "None")}},
        "spec": {"stopPolicy": "Hold"},
    }


def release_patch(cq: dict, saga_id: str | None = None) -> dict | None:
    """The merge patch that takes this saga's hold away (or every one of ours when None): the
    admission reopens only when the last saga that held it has ended."""
    notes = cq.get("metadata", {}).get("annotations") or {}
    sagas = holders(cq)
    if not sagas or (saga_id is not None and saga_id not in sagas):
        return None
    left = [s for s in sagas if saga_id is not None and s != saga_id]
    if left:
        return {"metadata": {"annotations": {HELD_BY: ",".join(left)}}}
    return {
        "metadata": {"annotations": {HELD_BY: None, PREVIOUS_STOP_POLICY: None}},
        "spec": {"stopPolicy": notes.get(PREVIOUS_STOP_POLICY, "None")},
    }


def event(obj: dict, reason: str, message: str, *, instance: str, now: float) -> dict:
    """A core/v1 Event about ``obj`` (shown by ``kubectl describe`` and ``kubectl get events``)."""
    meta = obj["metadata"]
    stamp = datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:12]}", "namespace": meta.get("namespace", "default")},
        "involvedObject": {
            "apiVersion": obj.get("apiVersion", ""),
            "kind": obj.get("kind", ""),
            "name": meta["name"],
            "namespace": meta.get("namespace", ""),
            "uid": meta.get("uid", ""),
        },
        "reason": reason,
        "message": message,
        "type": "Normal",
        "count": 1,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "source": {"component": "powerguard-power-control"},
        "reportingComponent": "powerguard.io/power-control",
        "reportingInstance": instance,
    }


def refused_by(status_details: dict | None, message: str) -> str:
    """What an eviction's 429 says: the budget's own words when the server names it."""
    causes = (status_details or {}).get("causes") or []
    named = [c.get("message", "") for c in causes if c.get("reason") == "DisruptionBudget"]
    return "; ".join(n for n in named if n) or message


def ready(node: dict) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (node.get("status") or {}).get("conditions") or []
    )
