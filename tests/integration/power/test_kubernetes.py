"""The Kubernetes adapter against the simulated API server (real protocol: resourceVersions,
watches with 410 Gone, the Eviction API with PodDisruptionBudgets, RBAC from the shipped
ClusterRole), with pods that run as real processes. The adapter runs as power-control's
service account: a verb the shipped role lacks fails here."""

from __future__ import annotations

import asyncio
import json

import pytest
import yaml

from powerguard.power_control.errors import SchedulerError
from powerguard.power_control.schedulers.kube_objects import HELD_BY
from powerguard.power_control.schedulers.kubernetes import KubernetesScheduler
from tests.kube_peer import RBAC, SimKube
from tests.waiting import eventually

pytestmark = pytest.mark.integration
JOB = "train"


def power(path, on: bool) -> None:
    path.write_text(json.dumps({"power": "on" if on else "off"}))


def jobset(name: str = JOB, *, queue: str | None = "team", grace_s: int = 5) -> dict:
    """A 2-replica JobSet whose pods trap SIGTERM (and say so in their log)."""
    script = "echo start $(IDX); trap 'echo sigterm $(IDX); exit 0' TERM; while true; do sleep 0.1; done"
    labels = {"powerguard.io/job": name, "app": name}
    meta = {"name": name, "labels": {"kueue.x-k8s.io/queue-name": queue} if queue else {}}
    pod = {
        "metadata": {"labels": labels},
        "spec": {
            "terminationGracePeriodSeconds": grace_s,
            "containers": [
                {
                    "name": "trainer",
                    "command": ["sh", "-c", script],
                    "env": [
                        {
                            "name": "IDX",
                            "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['jobset.sigs.k8s.io/job-index']"}},
                        }
                    ],
                }
            ],
        },
    }
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": meta,
        "spec": {
            "suspend": bool(queue),
            "replicatedJobs": [{"name": "workers", "replicas": 2, "template": {"spec": {"template": pod}}}],
        },
    }


QUEUES = [
    {
        "apiVersion": "kueue.x-k8s.io/v1beta1",
        "kind": "ClusterQueue",
        "metadata": {"name": "gpus"},
        "spec": {"namespaceSelector": {}},
    },
    {
        "apiVersion": "kueue.x-k8s.io/v1beta1",
        "kind": "LocalQueue",
        "metadata": {"name": "team"},
        "spec": {"clusterQueue": "gpus"},
    },
]


@pytest.fixture
def cluster(tmp_path):
    states = {n: tmp_path / f"bmc-{n}.json" for n in ("n1", "n2")}
    for s in states.values():
        power(s, True)
    kube = SimKube(tmp_path, states, labels={"powerguard.io/ups": "ups-a"}).start()
    kube.states = states
    try:
        yield kube
    finally:
        kube.stop()


def adapter(kube: SimKube, **opts) -> KubernetesScheduler:
    return KubernetesScheduler({"kubeconfig": str(kube.power_control), "poll_s": 0.1, **opts})


def pods(kube: SimKube, job: str = JOB) -> list[dict]:
    return kube.get("pods", "-l", f"powerguard.io/job={job}")["items"]


def running(kube: SimKube, n: int = 2) -> bool:
    ps = pods(kube)
    return len(ps) == n and all(p["status"].get("phase") == "Running" for p in ps)


def taints(kube: SimKube, node: str) -> list[tuple[str, str, str]]:
    return [(t["key"], t.get("value", ""), t["effect"]) for t in kube.get("node", node)["spec"].get("taints") or []]


def reasons(kube: SimKube) -> list[str]:
    return [e["reason"] for e in kube.get("events")["items"]]


async def test_an_outage_taints_holds_suspends_after_the_stop_and_resumes_in_order(cluster):
    cluster.apply([*QUEUES, jobset()])
    await eventually(
        lambda: running(cluster),
        20,
        "the JobSet admitted by Kueue and its 2 pods running",
        details=lambda: json.dumps(cluster.get("workloads")["items"])[-1500:],
    )
    k = adapter(cluster)
    try:
        said = await k.on_battery(["n1", "n2"], saga_id="s1")
        assert "held gpus" in said
        assert ("powerguard.io/on-battery", "s1", "NoSchedule") in taints(cluster, "n1")
        assert cluster.get("clusterqueue", "gpus")["spec"]["stopPolicy"] == "Hold"
        assert running(cluster), "on battery stops nothing: the ranks checkpoint through the bus first"

        said = await k.stop_job(JOB, nodes=["n1", "n2"], saga_id="s1")
        assert "deactivated Workload default/jobset-train" in said
        assert pods(cluster) == [], "stop_job returns once the job's pods are gone"
        js = cluster.get("jobset", JOB)
        assert js["spec"]["suspend"] is True, "the JobSet is kept, suspended (Kueue evicted the inactive Workload)"
        logs = "".join(p.read_text() for p in (cluster.dir / "pods").glob("*.log"))
        assert logs.count("sigterm") == 2, "each pod was stopped gracefully (SIGTERM, then removed)"
        assert {"PowerGuardCheckpointed", "PowerGuardSuspended"} <= set(reasons(cluster))

        for n in ("n1", "n2"):
            await k.node_restored(n, saga_id="s1")
            assert taints(cluster, n) == []
        said = await k.start_job(JOB, nodes=["n1", "n2"], saga_id="s1")
        assert "reactivated Workload default/jobset-train" in said
        await eventually(lambda: running(cluster), 20, "the JobSet's pods running again")
        assert "PowerGuardResumed" in reasons(cluster)
    finally:
        await k.close()
    # the order, from the API server's own audit log: untaint, then lift the hold, then resume
    writes = [
        (a["objectRef"]["resource"], a["objectRef"]["name"], a["annotations"].get("powerguard.io/detail", ""))
        for a in cluster.audit()
        if a["user"]["username"].endswith(":power-control")
    ]
    order = [
        i
        for i, w in enumerate(writes)
        if w
        in {
            ("nodes", "n2", "taints=[]"),
            ("clusterqueues", "gpus", "stopPolicy=None"),
            ("workloads", "jobset-train", "active=True"),
        }
    ]
    assert [writes[i] for i in order] == [
        ("nodes", "n2", "taints=[]"),
        ("clusterqueues", "gpus", "stopPolicy=None"),
        ("workloads", "jobset-train", "active=True"),
    ], writes


async def test_a_cancelled_outage_removes_its_taints_and_lifts_its_hold_only(cluster):
    cluster.apply(QUEUES)
    cluster.kubectl("taint", "node", "n2", "maintenance=ops:NoSchedule")
    k = adapter(cluster)
    try:
        await k.on_battery(["n1", "n2"], saga_id="s1")
        said = await k.outage_over(["n1", "n2"], saga_id="s1")
    finally:
        await k.close()
    assert "untainted n1, n2" in said and "released gpus" in said
    assert taints(cluster, "n1") == [] and taints(cluster, "n2") == [("maintenance", "ops", "NoSchedule")]
    assert cluster.get("clusterqueue", "gpus")["spec"]["stopPolicy"] == "None"


async def test_two_concurrent_outages_keep_admission_held_until_the_second_ends(cluster):
    """Before: saga s2 found the ClusterQueue held by s1 and recorded nothing; s1's end lifted the
    hold while s2's node was still on battery (admission reopened in the middle of s2's outage).
    Both sagas hold at once here, racing each other's conditional patches."""
    cluster.apply(QUEUES)
    k = adapter(cluster)
    try:
        await asyncio.gather(k.on_battery(["n1"], saga_id="s1"), k.on_battery(["n2"], saga_id="s2"))
        cq = cluster.get("clusterqueue", "gpus")
        assert cq["spec"]["stopPolicy"] == "Hold" and cq["metadata"]["annotations"][HELD_BY] == "s1,s2"
        said = await k.outage_over(["n1"], saga_id="s1")
        assert cluster.get("clusterqueue", "gpus")["spec"]["stopPolicy"] == "Hold", said  # s2 still holds it
        assert taints(cluster, "n2") == [("powerguard.io/on-battery", "s2", "NoSchedule")]
        said = await k.outage_over(["n2"], saga_id="s2")
    finally:
        await k.close()
    assert "released gpus" in said and cluster.get("clusterqueue", "gpus")["spec"]["stopPolicy"] == "None"


async def test_a_pdb_that_refuses_the_eviction_is_reported_by_name(cluster):
    """Pods of the job that no JobSet owns are evicted; a PodDisruptionBudget's 429 fails the
    step naming the budget (the API server's own words), the pods stay."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "solo", "labels": {"powerguard.io/job": "solo"}},
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "command": ["sleep", "600"]}]},
    }
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "solo-budget"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"powerguard.io/job": "solo"}}},
    }
    cluster.apply([pod, pdb])
    await eventually(lambda: cluster.get("pod", "solo")["status"].get("phase") == "Running", 20, "the pod running")
    k = adapter(cluster, stop_timeout_s=5)
    try:
        with pytest.raises(SchedulerError) as err:
            await k.stop_job("solo", nodes=["n1"], saga_id="s1")
    finally:
        await k.close()
    assert "eviction refused (429)" in str(err.value) and "solo-budget" in str(err.value), err.value
    assert cluster.get("pod", "solo")["metadata"].get("deletionTimestamp") is None


async def test_a_node_left_off_past_the_budget_gets_the_out_of_service_taint_and_loses_it_when_back(cluster):
    cluster.apply([jobset(queue=None)])
    await eventually(lambda: running(cluster), 20, "the JobSet's pods running")
    k = adapter(cluster, out_of_service_after_s=0.5)
    try:
        await k.on_battery(["n1"], saga_id="s1")
        power(cluster.states["n1"], False)
        await eventually(
            lambda: cluster.get("node", "n1")["status"]["conditions"][-1]["status"] != "True", 10, "n1 NotReady"
        )
        await k.node_powered_off("n1", saga_id="s1")
        await eventually(
            lambda: ("node.kubernetes.io/out-of-service", "powerguard", "NoExecute") in taints(cluster, "n1"),
            10,
            "the out-of-service taint on n1",
        )
        await eventually(
            lambda: all(
                p["spec"].get("nodeName") != "n1" or p["status"].get("phase") == "Pending" for p in pods(cluster)
            ),
            10,
            "n1's pods released (force-deleted)",
        )
        power(cluster.states["n1"], True)
        await k.node_restored("n1", saga_id="s1")
        assert taints(cluster, "n1") == []
    finally:
        await k.close()


async def test_the_ready_wait_recovers_from_a_watch_broken_by_410_gone(cluster):
    power(cluster.states["n2"], False)
    await eventually(
        lambda: cluster.get("node", "n2")["status"]["conditions"][-1]["status"] != "True", 10, "n2 NotReady"
    )
    k = adapter(cluster)
    try:
        waiting = asyncio.create_task(k.wait_ready("n2"))
        # the adapter's watch is open when a compaction ends one (the server counts them)
        await eventually(lambda: cluster.compact() >= 1, 10, "the adapter's watch open, then ended by a compaction")
        cluster.kubectl("label", "node", "n2", "touched=yes")  # a change the old resourceVersion cannot resume past
        power(cluster.states["n2"], True)
        await asyncio.wait_for(waiting, 15)
        assert k.api.relists >= 1, "the 410 was seen and the node listed again"
    finally:
        await k.close()


async def test_a_403_names_the_verb_and_resource_the_role_lacks(cluster, tmp_path):
    docs = list(yaml.safe_load_all(RBAC.read_text()))
    for d in docs:
        if d.get("kind") == "ClusterRole":
            d["rules"] = [r for r in d["rules"] if "clusterqueues" not in r["resources"]]
    limited = tmp_path / "limited.yaml"
    limited.write_text(yaml.safe_dump_all(docs))
    cluster.stop()
    kube = SimKube(tmp_path / "b", {"n1": None}, roles={"limited": limited})
    (tmp_path / "b").mkdir()
    kube.start()
    try:
        k = KubernetesScheduler({"kubeconfig": str(kube.dir / "limited.kubeconfig")})
        with pytest.raises(SchedulerError) as err:
            await k.on_battery(["n1"], saga_id="s1")
        await k.close()
    finally:
        kube.stop()
    assert "403" in str(err.value) and 'cannot list resource "clusterqueues" in API group "kueue.x-k8s.io"' in str(
        err.value
    ), err.value
    assert "packaging/kubernetes/rbac.yaml" in str(err.value), "the error says where the permission is granted"


async def test_config_check_reaches_the_api_server_and_names_what_is_wrong(cluster, tmp_path):
    good = adapter(cluster)
    wrong_map = adapter(cluster, node_map={"n1": "n1", "n3": "gpu-17"})
    no_file = KubernetesScheduler({"kubeconfig": str(tmp_path / "missing.kubeconfig")})
    try:
        assert await good.check({"n1": ["ups-a"], "n2": ["ups-a", "ups-b"]}) is None
        assert await wrong_map.check() == "kubernetes: node_map names nodes the cluster lacks: gpu-17"
        assert await good.check({"n1": ["ups-b"]}) == (
            "kubernetes: node n1: labelled powerguard.io/ups=ups-a, but the site file feeds it from ups-b"
        )
        assert "missing.kubeconfig" in await no_file.check()
    finally:
        for k in (good, wrong_map, no_file):
            await k.close()
