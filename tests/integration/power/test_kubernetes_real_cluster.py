"""The Kubernetes adapter against a real cluster, where one is at hand: set
``POWERGUARD_TEST_KUBECONFIG`` (and ``POWERGUARD_TEST_NODE``, a node it may taint for a moment;
default: the first node). Skipped otherwise. Checks the simulated API server's model on the
real thing: the taint and its removal, a Ready node's wait, Kueue's hold where Kueue runs."""

from __future__ import annotations

import os

import pytest

from powerguard.power_control.errors import SchedulerError
from powerguard.power_control.schedulers.kubernetes import KubernetesScheduler

KUBECONFIG = os.environ.get("POWERGUARD_TEST_KUBECONFIG")
pytestmark = [
    pytest.mark.integration,
    pytest.mark.kubernetes_cluster,
    pytest.mark.skipif(not KUBECONFIG, reason="no real cluster: set POWERGUARD_TEST_KUBECONFIG"),
]


async def test_taint_wait_ready_and_untaint_on_a_real_node():
    k = KubernetesScheduler({"kubeconfig": KUBECONFIG, "kueue": False})
    try:
        node = os.environ.get("POWERGUARD_TEST_NODE") or (await k.api.list("Node"))[0]["metadata"]["name"]
        await k.on_battery([node], saga_id="pg-test")
        taints = (await k.api.get("Node", node))["spec"].get("taints") or []
        assert {"key": "powerguard.io/on-battery", "value": "pg-test", "effect": "NoSchedule"} in taints
        await k.wait_ready(node)
        await k.outage_over([node], saga_id="pg-test")
        taints = (await k.api.get("Node", node))["spec"].get("taints") or []
        assert not any(t["key"] == "powerguard.io/on-battery" for t in taints)
    finally:
        await k.close()


async def test_kueue_hold_and_release_where_kueue_runs():
    k = KubernetesScheduler({"kubeconfig": KUBECONFIG})
    try:
        try:
            queues = await k.cluster_queues()
        except SchedulerError as exc:
            pytest.skip(f"no Kueue here: {exc}")
        held = await k.hold("pg-test")
        assert set(held) <= {q["metadata"]["name"] for q in queues}
        lifted = await k.release("pg-test")
        assert sorted(lifted) == sorted(held)
    finally:
        await k.close()
