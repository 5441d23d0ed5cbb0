"""The Kubernetes manifests as shipped (packaging/kubernetes/): they parse, the training pod's
leaf sidecar runs the same configuration as compose's leaf, and the trainer reaches it."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "packaging" / "kubernetes"


def docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]


def env(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}


def conf_lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]


def test_every_manifest_parses_and_the_role_is_bound_to_power_controls_account():
    kinds = {d["kind"] for f in K8S.glob("*.yaml") for d in docs(f.name)}
    assert {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Secret", "ConfigMap", "JobSet"} <= kinds
    rbac = {d["kind"]: d for d in docs("rbac.yaml")}
    assert rbac["ClusterRoleBinding"]["roleRef"]["name"] == rbac["ClusterRole"]["metadata"]["name"]
    sa = rbac["ServiceAccount"]["metadata"]
    assert rbac["ClusterRoleBinding"]["subjects"] == [
        {"kind": "ServiceAccount", "name": sa["name"], "namespace": sa["namespace"]}
    ]
    assert not any("*" in r["verbs"] or "*" in r["resources"] for r in rbac["ClusterRole"]["rules"])


def test_the_leaf_sidecar_runs_compose_s_leaf_configuration():
    (cm,) = docs("leaf-config.yaml")
    assert conf_lines(cm["data"]["nats-leaf.conf"]) == conf_lines((ROOT / "compose" / "nats-leaf.conf").read_text())


def test_the_example_jobs_pods_are_found_by_their_label_and_reach_their_leaf():
    js = next(d for d in docs("jobset-example.yaml") if d["kind"] == "JobSet")
    job = js["metadata"]["labels"]["powerguard.io/job"]
    assert "kueue.x-k8s.io/queue-name" in js["metadata"]["labels"] and js["spec"]["suspend"] is True
    pod = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    assert pod["metadata"]["labels"]["powerguard.io/job"] == job
    (leaf,) = pod["spec"]["initContainers"]
    (trainer,) = pod["spec"]["containers"]
    assert leaf["restartPolicy"] == "Always", "a native sidecar: up before the trainer, stopped after it"
    le, te = env(leaf), env(trainer)
    assert te["NATS_URL"]["value"] == f"nats://127.0.0.1:{le['NATS_LEAF_PORT']['value']}"
    assert te["NATS_JS_DOMAIN"]["value"] == "powerguard" and te["NATS_USER"]["value"] == le["NATS_LEAF_USER"]["value"]
    assert "$(NODE_NAME)" in le["NATS_LEAF_CREDS"]["value"], "the job's credential for the pod's own node"
    assert list(le).index("NODE_NAME") < list(le).index("NATS_LEAF_CREDS"), "defined before it is expanded"
