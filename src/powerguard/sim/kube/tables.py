"""Server-side printing: ``Accept: application/json;as=Table;v=v1;g=meta.k8s.io`` (what
``kubectl get`` asks for) answered with a ``meta.k8s.io/v1`` Table."""

from __future__ import annotations

from datetime import UTC, datetime

from .resources import Resource


def wants_table(accept: str) -> bool:
    return "as=Table" in accept


def _age(obj: dict, now: float) -> str:
    ts = obj["metadata"].get("creationTimestamp")
    if not ts:
        return "<unknown>"
    s = max(0, int(now - datetime.strptime(ts, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()))
    return f"{s}s" if s < 120 else f"{s // 60}m"


def _status(res: Resource, obj: dict) -> str:
    st = obj.get("status") or {}
    if res.kind == "Node":
        ready = next((c for c in st.get("conditions", []) if c.get("type") == "Ready"), {})
        text = "Ready" if ready.get("status") == "True" else "NotReady"
        return text + (",SchedulingDisabled" if (obj.get("spec") or {}).get("unschedulable") else "")
    if res.kind == "Pod":
        return "Terminating" if obj["metadata"].get("deletionTimestamp") else st.get("phase", "Pending")
    if res.kind == "JobSet":
        return "Suspended" if (obj.get("spec") or {}).get("suspend") else "Active"
    if res.kind == "Workload":
        return "Active" if (obj.get("spec") or {}).get("active", True) else "Inactive"
    if res.kind == "ClusterQueue":
        return (obj.get("spec") or {}).get("stopPolicy", "None")
    return ""


def table(res: Resource, objs: list[dict], *, rv: str, now: float) -> dict:
    cols = [{"name": "Name", "type": "string", "format": "name", "description": "Name", "priority": 0}]
    with_status = res.kind in ("Node", "Pod", "JobSet", "Workload", "ClusterQueue")
    if with_status:
        cols.append({"name": "Status", "type": "string", "format": "", "description": "Status", "priority": 0})
    if res.kind == "Pod":
        cols.append({"name": "Node", "type": "string", "format": "", "description": "Node", "priority": 0})
    cols.append({"name": "Age", "type": "string", "format": "", "description": "Age", "priority": 0})
    rows = []
    for o in objs:
        cells = [o["metadata"]["name"]]
        if with_status:
            cells.append(_status(res, o))
        if res.kind == "Pod":
            cells.append((o.get("spec") or {}).get("nodeName", "<none>"))
        cells.append(_age(o, now))
        partial = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": o["metadata"]}
        rows.append({"cells": cells, "object": partial})
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": rv},
        "columnDefinitions": cols,
        "rows": rows,
    }
