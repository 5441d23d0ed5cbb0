"""The simulated site's Kubernetes (``powerguard demo --kubernetes``): the simulated API server
(``python -m powerguard.sim.kube``) with one node per simulated node (Ready while its BMC says
on), Kueue's ClusterQueue ``gpus`` and LocalQueue ``team``, and the training job as a JobSet:
one pod per node, each a torchrun agent of a 2-node rendezvous under ``sim.launch`` (the pod's
processes die when its node's BMC turns it off). power-control runs the ``kubernetes`` adapter
as its own service account, bound to the shipped ClusterRole."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from powerguard.bus import free_ports

QUEUE, CLUSTER_QUEUE, NAMESPACE = "team", "gpus", "default"
JOB_LABEL = "powerguard.io/job"


class KubeSite:
    def __init__(self, workdir: Path, bmc_state: dict[str, Path], job: str) -> None:
        self.dir = workdir / "kube"
        self.bmc_state, self.job = bmc_state, job
        self.port, self.rdzv_port = free_ports(2)

    @property
    def admin(self) -> Path:
        return self.dir / "admin.kubeconfig"

    def argv(self) -> list[str]:
        from powerguard.power_control.schedulers.kubernetes import rbac_manifest

        from .kube import server_argv

        roles = {"power-control": rbac_manifest()}
        return server_argv(self.port, self.dir, self.bmc_state, roles=roles, labels={"powerguard.io/ups": "ups-a"})

    def scheduler(self) -> dict:
        """power-control's ``scheduler`` section of the site file."""
        return {
            "kind": "kubernetes",
            "options": {
                "kubeconfig": str(self.dir / "power-control.kubeconfig"),
                "stop_timeout_s": 30,
                "ready_timeout_s": 90,
                "out_of_service_after_s": 600,
                "poll_s": 0.2,
            },
        }

    def jobset(self, train_argv: list[str], ranks_per_node: int) -> dict:
        """The job as a JobSet: the standalone torchrun of the process adapter becomes one
        torchrun agent per pod (node rank = the pod's job index), queued in Kueue."""
        i = train_argv.index("--standalone")
        nodes = len(self.bmc_state)
        rest = train_argv[i + 3 :]  # after --standalone --nproc-per-node N
        torchrun = [
            *train_argv[:i],
            "--nnodes",
            str(nodes),
            "--node-rank",
            "$(NODE_RANK)",
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(self.rdzv_port),
            "--nproc-per-node",
            str(ranks_per_node),
            *rest,
        ]
        state_dir = next(iter(self.bmc_state.values())).parent
        command = [
            sys.executable,
            "-m",
            "powerguard.sim.launch",
            "--node-state",
            str(state_dir / "bmc-$(NODE_NAME).json"),
            "--",
            *torchrun,
        ]
        rank = {
            "name": "NODE_RANK",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['jobset.sigs.k8s.io/job-index']"}},
        }
        pod = {
            "metadata": {"labels": {JOB_LABEL: self.job}},
            "spec": {
                "terminationGracePeriodSeconds": 30,
                "containers": [{"name": "trainer", "command": command, "env": [rank], "workingDir": str(Path.cwd())}],
            },
        }
        return {
            "apiVersion": "jobset.x-k8s.io/v1alpha2",
            "kind": "JobSet",
            "metadata": {
                "name": self.job,
                "namespace": NAMESPACE,
                "labels": {"kueue.x-k8s.io/queue-name": QUEUE, JOB_LABEL: self.job},
            },
            "spec": {
                "suspend": True,
                "replicatedJobs": [{"name": "workers", "replicas": nodes, "template": {"spec": {"template": pod}}}],
            },
        }

    def _client(self):
        from lightkube import Client, KubeConfig

        return Client(config=KubeConfig.from_file(self.admin))

    @staticmethod
    def _resources():
        from lightkube.generic_resource import create_global_resource, create_namespaced_resource

        return (
            create_global_resource("kueue.x-k8s.io", "v1beta1", "ClusterQueue", "clusterqueues"),
            create_namespaced_resource("kueue.x-k8s.io", "v1beta1", "LocalQueue", "localqueues"),
            create_namespaced_resource("jobset.x-k8s.io", "v1alpha2", "JobSet", "jobsets"),
        )

    def start_job(self, train_argv: list[str], ranks_per_node: int) -> str:
        cq, lq, js = self._resources()
        with self._client() as c:
            c.create(cq.from_dict({"metadata": {"name": CLUSTER_QUEUE}, "spec": {"namespaceSelector": {}}}))
            c.create(
                lq.from_dict(
                    {"metadata": {"name": QUEUE, "namespace": NAMESPACE}, "spec": {"clusterQueue": CLUSTER_QUEUE}}
                ),
                namespace=NAMESPACE,
            )
            c.create(js.from_dict(self.jobset(train_argv, ranks_per_node)), namespace=NAMESPACE)
        return f"JobSet {NAMESPACE}/{self.job} created in Kueue's queue {QUEUE}"

    def job_running(self) -> bool:
        """A pod of the job is pending or running (none: finished, or suspended)."""
        from lightkube.resources.core_v1 import Pod

        with self._client() as c:
            pods = list(c.list(Pod, namespace=NAMESPACE, labels={JOB_LABEL: self.job}))
        return any((p.status.phase if p.status else "Pending") in ("Pending", "Running") for p in pods)

    def audit(self) -> list[dict]:
        """The API server's audit log (one line per write, in order)."""
        path = self.dir / "audit.log"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def powerguard_writes(self) -> list[str]:
        """What power-control wrote, in order (``verb resource/name detail``)."""
        out = []
        for a in self.audit():
            if a["user"]["username"].endswith(":power-control") and a["responseStatus"]["code"] < 300:
                ref = a["objectRef"]
                what = f"{ref['resource']}/{ref['subresource']}" if ref["subresource"] else ref["resource"]
                out.append(
                    f"{a['verb']} {what}/{ref['name']} {a['annotations'].get('powerguard.io/detail', '')}".strip()
                )
        return out

    def report(self) -> dict:
        """power-control's writes in order, and when the workload was deactivated and reactivated
        (the audit log's own timestamps)."""
        stamps: dict[str, str] = {}
        for a in self.audit():
            detail = a["annotations"].get("powerguard.io/detail", "")
            if a["user"]["username"].endswith(":power-control") and a["objectRef"]["resource"] == "workloads":
                key = {"active=False": "deactivated_at", "active=True": "reactivated_at"}.get(detail)
                if key and key not in stamps:
                    stamps[key] = a["requestReceivedTimestamp"]
        pods = sum(
            1
            for a in self.audit()
            if a["verb"] == "create" and a["objectRef"]["resource"] == "pods" and not a["objectRef"]["subresource"]
        )
        return {"writes": self.powerguard_writes(), **stamps, "pods_created": pods}
