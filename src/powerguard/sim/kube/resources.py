"""The resources the simulated API server serves, and its discovery documents (``/api``,
``/apis``, ``/api/v1``, ``/apis/<group>/<version>``) built from them."""

from __future__ import annotations

from dataclasses import dataclass, field

READ = ["get", "list", "watch"]
WRITE = ["create", "update", "patch", "delete"]


@dataclass(frozen=True)
class Resource:
    group: str  # "" for the core group
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    subresources: tuple[str, ...] = ()  # "status", "eviction"
    short_names: tuple[str, ...] = ()
    verbs: tuple[str, ...] = tuple(READ + WRITE)
    categories: tuple[str, ...] = field(default=())

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> str:
        """``jobsets.jobset.x-k8s.io`` (as in Kubernetes' own messages), ``pods`` for the core group."""
        return f"{self.plural}.{self.group}" if self.group else self.plural


RESOURCES = (
    Resource("", "v1", "namespaces", "Namespace", namespaced=False, short_names=("ns",)),
    Resource("", "v1", "nodes", "Node", namespaced=False, subresources=("status",), short_names=("no",)),
    Resource("", "v1", "pods", "Pod", subresources=("status", "eviction"), short_names=("po",)),
    Resource("", "v1", "events", "Event", short_names=("ev",)),
    Resource("batch", "v1", "jobs", "Job", subresources=("status",)),
    Resource("apps", "v1", "daemonsets", "DaemonSet", subresources=("status",), short_names=("ds",)),
    Resource(
        "policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", subresources=("status",), short_names=("pdb",)
    ),
    Resource("jobset.x-k8s.io", "v1alpha2", "jobsets", "JobSet", subresources=("status",)),
    Resource("kueue.x-k8s.io", "v1beta1", "workloads", "Workload", subresources=("status",), short_names=("wl",)),
    Resource(
        "kueue.x-k8s.io",
        "v1beta1",
        "clusterqueues",
        "ClusterQueue",
        namespaced=False,
        subresources=("status",),
        short_names=("cq",),
    ),
    Resource("kueue.x-k8s.io", "v1beta1", "localqueues", "LocalQueue", subresources=("status",), short_names=("lq",)),
    Resource("trainer.kubeflow.org", "v1alpha1", "trainjobs", "TrainJob", subresources=("status",)),
)
BY_PATH = {(r.group, r.version, r.plural): r for r in RESOURCES}
BY_KIND = {r.kind: r for r in RESOURCES}


def find(group: str, version: str, plural: str) -> Resource | None:
    return BY_PATH.get((group, version, plural))


def groups() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for r in RESOURCES:
        if r.group and r.version not in out.setdefault(r.group, []):
            out[r.group].append(r.version)
    return out


def api_versions() -> dict:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}],
    }


def api_group_list() -> dict:
    return {
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": [
            {
                "name": g,
                "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in vs],
                "preferredVersion": {"groupVersion": f"{g}/{vs[0]}", "version": vs[0]},
            }
            for g, vs in groups().items()
        ],
    }


def resource_list(group: str, version: str) -> dict | None:
    rs = [r for r in RESOURCES if r.group == group and r.version == version]
    if not rs:
        return None
    items = []
    for r in rs:
        items.append(
            {
                "name": r.plural,
                "singularName": r.kind.lower(),
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": list(r.verbs),
                **({"shortNames": list(r.short_names)} if r.short_names else {}),
            }
        )
        for sub in r.subresources:
            verbs = ["create"] if sub == "eviction" else ["get", "patch", "update"]
            kind = "Eviction" if sub == "eviction" else r.kind
            extra = {"group": "policy", "version": "v1"} if sub == "eviction" else {}
            items.append(
                {
                    "name": f"{r.plural}/{sub}",
                    "singularName": "",
                    "namespaced": r.namespaced,
                    "kind": kind,
                    "verbs": verbs,
                    **extra,
                }
            )
    gv = f"{group}/{version}" if group else version
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": items}
