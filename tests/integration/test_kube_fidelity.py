"""The simulated Kubernetes API server checked by clients nobody here wrote: kubectl (drain:
cordon, field selectors, the Eviction API with a PodDisruptionBudget, waiting for deletion;
get --watch; taint; patch of every type) and the official Python client (resourceVersion
conflicts, watches resumed from a resourceVersion, 410 Gone after a compaction)."""

from __future__ import annotations

import json
import subprocess

import pytest
from kubernetes import client, config, watch

from tests.kube_peer import SimKube, kubectl_binary
from tests.waiting import eventually_sync

pytestmark = pytest.mark.integration


@pytest.fixture
def kube(tmp_path):
    k = SimKube(tmp_path, {"n1": None, "n2": None}).start()
    try:
        yield k
    finally:
        k.stop()


def pod(name: str, node: str, app: str = "web") -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": app}},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 2,
            "containers": [{"name": "c", "command": ["sleep", "600"]}],
        },
    }


def owned(name: str, node: str) -> dict:
    """A pod with a controller (kubectl drain refuses unmanaged pods without --force)."""
    p = pod(name, node)
    p["metadata"]["ownerReferences"] = [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "u-1", "controller": True}
    ]
    return p


def test_kubectl_drain_cordons_respects_the_budget_then_evicts_and_waits(kube):
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"}, "spec": {}}
    kube.apply([job])
    uid = kube.get("job", "j")["metadata"]["uid"]
    pods = [owned("a", "n1"), owned("b", "n1"), owned("c", "n2")]
    for p in pods:
        p["metadata"]["ownerReferences"][0]["uid"] = uid
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "web-budget"},
        "spec": {"minAvailable": 3, "selector": {"matchLabels": {"app": "web"}}},
    }
    kube.apply([*pods, pdb])
    eventually_sync(
        lambda: all(p["status"].get("phase") == "Running" for p in kube.get("pods")["items"]), 20, "3 pods running"
    )
    refused = kube.kubectl("drain", "n1", "--timeout=3s", check=False)
    assert refused.returncode != 0
    assert "disruption budget" in refused.stderr, refused.stderr
    assert kube.get("node", "n1")["spec"].get("unschedulable") is True, "drain cordoned the node first"
    kube.kubectl("delete", "pdb", "web-budget")
    done = kube.kubectl("drain", "n1", "--timeout=30s")
    assert "node/n1 drained" in done.stdout, done.stdout
    left = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in kube.get("pods")["items"]}
    assert left == {"c": "n2"}, "n1's pods were evicted and drain waited for them to be gone"
    assert {a["objectRef"]["subresource"] for a in kube.audit() if a["verb"] == "create"} >= {"eviction"}


def test_kubectl_get_watch_streams_the_changes_it_did_not_list(kube):
    binary = kubectl_binary()
    proc = subprocess.Popen(
        [binary, "--kubeconfig", str(kube.admin), "get", "nodes", "--watch", "-o", "json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # kubectl prints each object as a pretty JSON document: read until both nodes were listed
        buf, docs = "", []
        decoder = json.JSONDecoder()

        def read_docs(n: int) -> None:
            nonlocal buf
            while len(docs) < n:
                buf += proc.stdout.readline()
                try:
                    obj, end = decoder.raw_decode(buf.strip())
                except json.JSONDecodeError:
                    continue
                docs.append(obj)
                buf = buf.strip()[end:]

        read_docs(2)
        assert sorted(d["metadata"]["name"] for d in docs) == ["n1", "n2"]
        kube.kubectl("taint", "node", "n2", "powerguard.io/on-battery=s1:NoSchedule")
        read_docs(3)
        assert docs[2]["metadata"]["name"] == "n2"
        assert docs[2]["spec"]["taints"] == [{"key": "powerguard.io/on-battery", "value": "s1", "effect": "NoSchedule"}]
    finally:
        proc.kill()
        proc.wait()


def test_kubectl_patches_of_every_type_and_server_side_tables(kube):
    kube.kubectl("patch", "node", "n1", "--type=merge", "-p", '{"metadata":{"labels":{"a":"1"}}}')
    kube.kubectl("patch", "node", "n1", "--type=json", "-p", '[{"op":"add","path":"/metadata/labels/b","value":"2"}]')
    kube.kubectl("patch", "node", "n1", "-p", '{"metadata":{"labels":{"a":null}}}')  # strategic (kubectl's default)
    labels = kube.get("node", "n1")["metadata"]["labels"]
    assert labels.get("b") == "2" and "a" not in labels
    failed = kube.kubectl(
        "patch",
        "node",
        "n1",
        "--type=json",
        "-p",
        '[{"op":"test","path":"/metadata/labels/b","value":"9"}]',
        check=False,
    )
    assert failed.returncode != 0 and "testing value" in failed.stderr
    table = kube.kubectl("get", "nodes", "-l", "b=2").stdout
    assert table.split()[:4] == ["NAME", "STATUS", "AGE", "n1"], table
    assert (
        kube.kubectl("get", "nodes", "--field-selector", "metadata.name=n2", "-o", "name").stdout.strip() == "node/n2"
    )


def test_the_python_client_sees_conflicts_watches_and_410_gone(kube):
    config.load_kube_config(str(kube.admin))
    api = client.ApiClient()
    v1 = client.CoreV1Api(api)
    try:
        listed = v1.list_node()
        stale = v1.read_node("n1")
        v1.patch_node("n1", {"metadata": {"labels": {"x": "1"}}})
        stale.metadata.labels["y"] = "2"
        with pytest.raises(client.ApiException) as err:
            v1.replace_node("n1", stale)
        assert err.value.status == 409 and "the object has been modified" in err.value.body
        seen = [
            (e["type"], e["object"].metadata.name)
            for e in watch.Watch().stream(
                v1.list_node, resource_version=listed.metadata.resource_version, timeout_seconds=1
            )
        ]
        assert ("MODIFIED", "n1") in seen, seen
        kube.compact()
        with pytest.raises(client.ApiException) as gone:
            for _ in watch.Watch().stream(
                v1.list_node, resource_version=listed.metadata.resource_version, timeout_seconds=1
            ):
                pass
        assert gone.value.status == 410
    finally:
        api.close()
