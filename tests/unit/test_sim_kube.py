"""The simulated Kubernetes API server's semantics, unit by unit: patches (RFC 7386, RFC 6902,
strategic merge by merge key), selectors, optimistic concurrency, the /status split, the
history a watch resumes from (410 once compacted), PodDisruptionBudget arithmetic."""

from __future__ import annotations

import pytest

from powerguard.sim.kube import patches, selectors
from powerguard.sim.kube.api import Api, disruptions_allowed
from powerguard.sim.kube.errors import ApiError
from powerguard.sim.kube.resources import BY_KIND
from powerguard.sim.kube.store import Store

NODE, POD, JOBSET, PDB = BY_KIND["Node"], BY_KIND["Pod"], BY_KIND["JobSet"], BY_KIND["PodDisruptionBudget"]


def test_merge_patch_sets_and_deletes_and_replaces_lists():
    doc = {"a": {"b": 1, "c": 2}, "l": [1, 2]}
    assert patches.merge(doc, {"a": {"b": None, "d": 3}, "l": [3]}) == {"a": {"c": 2, "d": 3}, "l": [3]}


def test_json_patch_operations_and_a_failed_test():
    doc = {"metadata": {"labels": {"a": "1"}}, "l": [1, 3]}
    out = patches.json_patch(
        doc,
        [
            {"op": "add", "path": "/l/1", "value": 2},
            {"op": "remove", "path": "/metadata/labels/a"},
            {"op": "add", "path": "/metadata/labels/x~1y", "value": "z"},
            {"op": "move", "from": "/l/0", "path": "/first"},
        ],
    )
    assert out == {"metadata": {"labels": {"x/y": "z"}}, "l": [2, 3], "first": 1}
    with pytest.raises(ApiError) as err:
        patches.json_patch(doc, [{"op": "test", "path": "/metadata/labels/a", "value": "2"}])
    assert err.value.code == 422


def test_strategic_merge_merges_lists_by_their_key_and_honours_delete():
    pod = {"spec": {"containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "y"}]}}
    out = patches.strategic(
        pod, {"spec": {"containers": [{"name": "b", "image": "z"}, {"name": "a", "$patch": "delete"}]}}
    )
    assert out == {"spec": {"containers": [{"name": "b", "image": "z"}]}}
    node = {"spec": {"taints": [{"key": "a", "effect": "NoSchedule"}]}}
    assert patches.strategic(node, {"spec": {"taints": [{"key": "b", "effect": "NoSchedule"}]}})["spec"]["taints"] == [
        {"key": "b", "effect": "NoSchedule"}
    ], "taints have no merge key: replaced whole, as the API server does"


def test_label_and_field_selectors():
    obj = {"metadata": {"name": "p", "labels": {"app": "web", "tier": "1"}}, "spec": {"nodeName": "n1"}}
    assert selectors.labels("app=web,tier in (1,2),!gone")(obj)
    assert not selectors.labels("app!=web")(obj)
    assert selectors.fields("spec.nodeName=n1,metadata.name=p", "pods")(obj)
    with pytest.raises(ApiError):
        selectors.fields("spec.unknown=x", "pods")


def store() -> Store:
    return Store(clock=lambda: 1_000_000.0, history=4)


def test_a_stale_resource_version_is_a_conflict_and_status_is_its_own_subresource():
    s = store()
    js = s.create(JOBSET, "default", {"metadata": {"name": "j"}, "spec": {"suspend": False}})
    fresh = s.replace(JOBSET, "default", "j", {**js, "spec": {"suspend": True}, "status": {"x": 1}})
    assert fresh["spec"]["suspend"] is True and "status" not in fresh, "the main resource ignores status"
    with pytest.raises(ApiError) as err:
        s.replace(JOBSET, "default", "j", {**js, "spec": {"suspend": False}})
    assert err.value.code == 409
    st = s.replace(
        JOBSET, "default", "j", {**fresh, "spec": {"suspend": False}, "status": {"x": 1}}, subresource="status"
    )
    assert st["status"] == {"x": 1} and st["spec"]["suspend"] is True, "/status changes the status only"


def test_a_watch_resumes_from_kept_history_and_gets_410_once_compacted():
    s = store()
    s.create(NODE, "", {"metadata": {"name": "n1"}})
    rv = s.rv
    for i in range(6):  # more changes than the history keeps
        s.create(NODE, "", {"metadata": {"name": f"m{i}"}})
    with pytest.raises(ApiError) as err:
        s.since(rv)
    assert err.value.code == 410
    assert [c.obj["metadata"]["name"] for c in s.since(s.rv - 2)] == ["m4", "m5"]
    s.compact()
    with pytest.raises(ApiError):
        s.since(s.rv - 1)
    assert s.since(s.rv) == []


def test_a_budget_counts_healthy_pods_and_an_eviction_past_it_is_429():
    s = store()
    api = Api(s)
    for n in ("a", "b"):
        p = api.create(
            "u", POD, "default", {"metadata": {"name": n, "labels": {"app": "x"}}, "spec": {"nodeName": "n1"}}
        )
        s.replace(
            POD,
            "default",
            n,
            {**p, "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}},
            subresource="status",
        )
    pdb = api.create(
        "u",
        PDB,
        "default",
        {"metadata": {"name": "x-budget"}, "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "x"}}}},
    )
    assert disruptions_allowed(s, pdb) == (1, 1, 2)
    api.evict("u", "default", "a", {})
    assert s.get(POD, "default", "a")["metadata"]["deletionTimestamp"], "evicted: deleted gracefully"
    with pytest.raises(ApiError) as err:
        api.evict("u", "default", "b", {})
    assert err.value.code == 429 and "x-budget" in err.value.details["causes"][0]["message"]
