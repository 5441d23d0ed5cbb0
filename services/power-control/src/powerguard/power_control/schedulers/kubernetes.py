"""Kubernetes: GPU training jobs on a cluster (JobSet, Kubeflow TrainJob, Kueue) through the
Kubernetes API with lightkube (an asyncio client with typed core resources and generic custom
resources: power-control is asyncio; the official client is synchronous).

- on battery (the saga starts): the nodes at risk get ``powerguard.io/on-battery=<saga>:NoSchedule``
  (attributable, unlike ``spec.unschedulable``), the ClusterQueues' admission is held
  (``stopPolicy: Hold``), so nothing new lands on a node about to lose power;
- the checkpoint goes through PowerGuard's own bus (the ckpt-agent in each pod), not SIGTERM;
- job stop (sent by the coordinator only after every rank acked): the job's workload, found from
  its pods on the nodes (``fieldSelector=spec.nodeName``) through their owners (Job -> JobSet ->
  TrainJob, and Kueue's Workload), is deactivated (``Workload.spec.active=false``) or suspended
  (``spec.suspend=true``): the object and its history stay; the job's pods left over are evicted
  (a PodDisruptionBudget's 429 reported by name); Events PowerGuardCheckpointed/Suspended;
- a node off past ``out_of_service_after_s`` gets ``node.kubernetes.io/out-of-service:NoExecute``
  (its pods and volumes released);
- power back: waits for the node's ``Ready`` (a watch, relisted after 410 Gone), removes our
  taints; the job start lifts our hold and resumes the workload (Event PowerGuardResumed).

A 403 names the verb, resource and group the API refused; the shipped ClusterRole
(packaging/kubernetes/rbac.yaml, this package's ``kubernetes-rbac.yaml``: :func:`rbac_manifest`)
grants exactly what this file uses."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from ..errors import KubeApiError, SchedulerError
from . import kube_objects as ko
from .base import Scheduler, job_name
from .kube_api import KubeApi

log = logging.getLogger(__name__)


def rbac_manifest() -> Path:
    """The shipped ServiceAccount, ClusterRole and binding (packaging/kubernetes/rbac.yaml)."""
    return Path(__file__).with_name("kubernetes-rbac.yaml")


class KubernetesOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kubeconfig: str | None = Field(default=None, description="kubeconfig file (default: in-cluster, else $KUBECONFIG)")
    context: str | None = Field(default=None, description="kubeconfig context (default: its current one)")
    node_map: dict[str, str] = Field(default_factory=dict, description="PowerGuard node -> Kubernetes node name")
    namespaces: list[str] = Field(default_factory=list, description="Where training jobs run (default: every one)")
    job_label: str = Field(default="powerguard.io/job", description="The pod label that names the PowerGuard job")
    cluster_queues: list[str] | None = Field(
        default=None, description="Kueue ClusterQueues held on battery (default: every one; [] holds none)"
    )
    kueue: bool = Field(default=True, description="Deactivate Kueue Workloads (false: suspend the workload itself)")
    stop_timeout_s: float = Field(default=120.0, gt=0, description="Wait for the job's pods to be gone")
    ready_timeout_s: float = Field(default=300.0, gt=0, description="Wait for a powered-on node to be Ready")
    out_of_service_after_s: float = Field(
        default=300.0, gt=0, description="A node still off this long gets the out-of-service taint"
    )
    request_timeout_s: float = Field(default=10.0, gt=0)
    poll_s: float = Field(default=0.5, gt=0)


class KubernetesScheduler(Scheduler):
    kind = "kubernetes"

    def __init__(self, options: dict, *, instance: str = "power-control") -> None:
        self.opts = KubernetesOptions.model_validate(options)
        self.one_stop_s = self.opts.stop_timeout_s + 4 * self.opts.request_timeout_s
        self.instance = instance
        self.api = KubeApi(self.opts.kubeconfig, self.opts.context, self.opts.request_timeout_s, instance)
        self._off_timers: dict[str, asyncio.Task] = {}

    async def check(self, feeds: Mapping[str, Sequence[str]] | None = None) -> str | None:
        """The kubeconfig loads, the API server answers, the nodes may be read, node_map's nodes
        exist, and a node labelled ``powerguard.io/ups`` is fed by that UPS in the site file (the
        site file is the topology; a label that disagrees is a mistake in one of them)."""
        try:
            nodes = {n["metadata"]["name"]: n for n in await self.api.list("Node")}
        except SchedulerError as exc:
            return str(exc)
        except Exception as exc:  # a kubeconfig that does not load: lightkube's own error type
            return f"kubernetes: {type(exc).__name__}: {exc}"
        problems = []
        missing = [n for n in self.opts.node_map.values() if n not in nodes]
        if missing:
            problems.append(f"node_map names nodes the cluster lacks: {', '.join(missing)}")
        for node, ups in sorted((feeds or {}).items()):
            obj = nodes.get(self._node(node))
            label = ((obj or {}).get("metadata", {}).get("labels") or {}).get(ko.UPS_LABEL)
            if label is not None and label not in ups:
                problems.append(
                    f"node {node}: labelled {ko.UPS_LABEL}={label}, but the site file feeds it from {', '.join(ups)}"
                )
        return "kubernetes: " + "; ".join(problems) if problems else None

    async def close(self) -> None:
        for t in self._off_timers.values():
            t.cancel()
        await self.api.close()

    def _node(self, node: str) -> str:
        return self.opts.node_map.get(node, node)

    # ------------------------------------------------------------ taints
    async def _taints(self, node: str, change) -> bool:
        """Rewrite a node's taints with ``change(taints) -> new | None``, conditional on the
        resourceVersion read (a JSON patch with a ``test``: a concurrent writer's 422/409 is read
        again), so nobody else's taint is lost."""
        for _ in range(5):
            obj = await self.api.get("Node", node)
            taints = (obj.get("spec") or {}).get("taints") or []
            new = change(taints)
            if new is None:
                return False
            ops = [
                {"op": "test", "path": "/metadata/resourceVersion", "value": obj["metadata"]["resourceVersion"]},
                {"op": "add", "path": "/spec/taints", "value": new},
            ]
            try:
                await self.api.patch("Node", node, ops, json_patch=True)
                return True
            except KubeApiError as exc:
                if exc.code not in (409, 422):
                    raise
        raise SchedulerError(f"kubernetes: node {node}: its taints kept changing under five tries")

    async def taint_on_battery(self, node: str, saga_id: str) -> bool:
        return await self._taints(self._node(node), lambda t: ko.with_taint(t, ko.ON_BATTERY, saga_id, "NoSchedule"))

    # ------------------------------------------------------------ the hold
    async def cluster_queues(self) -> list[dict]:
        if self.opts.cluster_queues == []:
            return []
        cqs = await self.api.list("ClusterQueue")
        if self.opts.cluster_queues is None:
            return cqs
        return [c for c in cqs if c["metadata"]["name"] in self.opts.cluster_queues]

    async def hold(self, saga_id: str) -> list[str]:
        """Hold every (configured) ClusterQueue that is open; the ones held, by name."""
        return await self._patch_queues(lambda cq: ko.hold_patch(cq, saga_id))

    async def release(self, saga_id: str | None) -> list[str]:
        """Lift our hold (of this saga, or any of ours when None); the ones lifted, by name."""
        return await self._patch_queues(lambda cq: ko.release_patch(cq, saga_id))

    async def _patch_queues(self, patch_of) -> list[str]:
        """Patch each (configured) ClusterQueue with ``patch_of(cq)``, conditional on the
        resourceVersion read: two sagas holding or lifting at once never lose each other's word
        (a 409 reads it again)."""
        if not self.opts.kueue:
            return []
        done = []
        for cq in await self.cluster_queues():
            name = cq["metadata"]["name"]
            for _ in range(5):
                patch = patch_of(cq)
                if patch is None:
                    break
                patch.setdefault("metadata", {})["resourceVersion"] = cq["metadata"]["resourceVersion"]
                try:
                    await self.api.patch("ClusterQueue", name, patch)
                except KubeApiError as exc:
                    if exc.code != 409:
                        raise
                    # read again (the role lists ClusterQueues; it needs no get)
                    cq = next((c for c in await self.api.list("ClusterQueue") if c["metadata"]["name"] == name), None)
                    if cq is None:
                        break
                    continue
                done.append(name)
                break
            else:
                raise SchedulerError(f"kubernetes: ClusterQueue {name}: kept changing under five tries")
        return done

    # ------------------------------------------------------------ the saga's edges
    async def on_battery(self, nodes: Sequence[str], *, saga_id: str) -> str:
        tainted = [n for n in nodes if await self.taint_on_battery(n, saga_id)]
        held = await self.hold(saga_id)
        return (
            f"tainted {', '.join(tainted) or 'no new node'} {ko.ON_BATTERY}:NoSchedule; "
            f"held {', '.join(held) or 'no ClusterQueue'}"
        )

    async def outage_over(self, nodes: Sequence[str], *, saga_id: str) -> str:
        untainted = []
        for n in nodes:
            if await self._taints(self._node(n), lambda t: ko.without_taints(t, [(ko.ON_BATTERY, saga_id)])):
                untainted.append(n)
        lifted = await self.release(saga_id)
        return f"untainted {', '.join(untainted) or 'no node'}; released {', '.join(lifted) or 'no ClusterQueue'}"

    # ------------------------------------------------------------ jobs
    async def _workloads(self, job: str, nodes: Sequence[str]) -> list[dict]:
        """The top objects (JobSet, TrainJob) of the job's pods on these nodes, followed through
        their controllers; each with the Kueue Workload that owns its admission, if any."""
        tops: dict[str, dict] = {}
        for pod in await self._pods_left(job, nodes):
            obj, ns = pod, pod["metadata"]["namespace"]
            chain = [pod]
            while (ref := ko.controller(obj)) is not None and ref.get("kind") in ko.CHAIN_KINDS:
                obj = await self.api.get(ref["kind"], ref["name"], ns)
                chain.append(obj)
            top = next((o for o in reversed(chain) if o.get("kind") in ko.SUSPENDABLE), None)
            if top is not None:
                tops[top["metadata"]["uid"]] = top
        return list(tops.values())

    async def _kueue_workload(self, top: dict) -> dict | None:
        if not self.opts.kueue:
            return None
        ns, uid = top["metadata"]["namespace"], top["metadata"]["uid"]
        for wl in await self.api.list("Workload", namespace=ns):
            if any(o.get("uid") == uid for o in wl["metadata"].get("ownerReferences") or []):
                return wl
        return None

    async def _pods_left(self, job: str, nodes: Sequence[str]) -> list[dict]:
        """The job's pods on these nodes (``fieldSelector=spec.nodeName``, the job's label)."""
        left: list[dict] = []
        for ns in self.opts.namespaces or [None]:
            for node in nodes:
                left += await self.api.list(
                    "Pod",
                    namespace=ns,
                    labels={self.opts.job_label: job_name(job)},
                    fields={"spec.nodeName": self._node(node)},
                )
        return left

    async def prepare_shutdown(self, node: str, *, saga_id: str, jobs: Sequence[str]) -> str:
        self._cancel_timer(node)
        await self.taint_on_battery(node, saga_id)
        done = [await self.stop_job(job, nodes=[node], saga_id=saga_id) for job in jobs]
        return f"tainted {self._node(node)}" + (f"; {'; '.join(done)}" if done else "")

    async def stop_job(self, job: str, *, nodes: Sequence[str], saga_id: str) -> str:
        tops = await self._workloads(job, nodes)
        said = []
        for top in tops:
            meta, kind = top["metadata"], top["kind"]
            label = {"metadata": {"labels": {ko.SUSPENDED_BY: saga_id, self.opts.job_label: job_name(job)}}}
            await self.api.event(
                top,
                "PowerGuardCheckpointed",
                f"every rank of job {job} acked its checkpoint (outage {saga_id}); stopping it before the power-off",
            )
            wl = await self._kueue_workload(top)
            await self.api.patch(kind, meta["name"], label, namespace=meta["namespace"])
            if wl is not None:
                await self.api.patch(
                    "Workload",
                    wl["metadata"]["name"],
                    {**label, "spec": {"active": False}},
                    namespace=meta["namespace"],
                )
                said.append(f"deactivated Workload {meta['namespace']}/{wl['metadata']['name']}")
            else:
                await self.api.patch(kind, meta["name"], {"spec": {"suspend": True}}, namespace=meta["namespace"])
                said.append(f"suspended {kind} {meta['namespace']}/{meta['name']}")
            await self.api.event(top, "PowerGuardSuspended", f"{said[-1]} for outage {saga_id}")
        if not tops and not await self._pods_left(job, nodes):
            return f"no pod of job {job} on {', '.join(nodes)} (stopped already)"
        refusals = await self._drain_job(job, nodes, evict_all=not tops)
        if refusals:
            raise SchedulerError(f"kubernetes: job {job}: {'; '.join(refusals)}")
        return "; ".join(said) if said else f"evicted the pods of job {job}"

    async def _drain_job(self, job: str, nodes: Sequence[str], *, evict_all: bool) -> list[str]:
        """Wait for the job's pods on these nodes to be gone; the ones nobody is deleting (no
        suspended owner) are evicted. Returns what refused (named), or what is still there."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.opts.stop_timeout_s
        refusals: dict[str, str] = {}
        evicted: set[str] = set()
        grace_until = loop.time() + (0 if evict_all else min(10.0, self.opts.stop_timeout_s / 4))
        while True:
            left = await self._pods_left(job, nodes)
            if not left:
                return []
            for pod in left:
                uid = pod["metadata"]["uid"]
                if pod["metadata"].get("deletionTimestamp") or uid in evicted or loop.time() < grace_until:
                    continue
                why = await self.api.evict(pod)
                if why is None:
                    evicted.add(uid)
                    refusals.pop(uid, None)
                else:
                    refusals[uid] = why
            if loop.time() >= deadline:
                names = ", ".join(f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in left)
                return list(refusals.values()) or [f"pods still there after {self.opts.stop_timeout_s:.0f}s: {names}"]
            if refusals and all(p["metadata"]["uid"] in refusals for p in left):
                return list(refusals.values())  # a budget that refuses now refuses until its pods change
            await asyncio.sleep(self.opts.poll_s)

    async def start_job(self, job: str, *, nodes: Sequence[str], saga_id: str) -> str:
        await self.release(None)  # nothing new was admitted while on battery; the restore lifts it first
        said = []
        sel = {ko.SUSPENDED_BY: None, self.opts.job_label: job_name(job)}
        wls = await self.api.list("Workload", labels=sel) if self.opts.kueue else []
        drop = {"metadata": {"labels": {ko.SUSPENDED_BY: None}}}
        for wl in wls:
            m = wl["metadata"]
            await self.api.patch("Workload", m["name"], {**drop, "spec": {"active": True}}, namespace=m["namespace"])
            said.append(f"reactivated Workload {m['namespace']}/{m['name']}")
        for kind in ("JobSet", "TrainJob"):
            try:
                tops = await self.api.list(kind, labels=sel)
            except SchedulerError as exc:
                if " 404 " in str(exc):  # that custom resource is not installed in this cluster
                    continue
                raise
            for top in tops:
                m = top["metadata"]
                patch = drop if wls else {**drop, "spec": {"suspend": False}}
                await self.api.patch(kind, m["name"], patch, namespace=m["namespace"])
                if not wls:
                    said.append(f"resumed {kind} {m['namespace']}/{m['name']}")
                await self.api.event(
                    top,
                    "PowerGuardResumed",
                    f"job {job} resumed after outage {saga_id}; its ranks restore from the newest committed checkpoint",
                )
        return "; ".join(said) if said else f"no workload of job {job} suspended by PowerGuard"

    # ------------------------------------------------------------ nodes off and back
    def _cancel_timer(self, node: str) -> None:
        if (t := self._off_timers.pop(node, None)) is not None:
            t.cancel()

    async def node_powered_off(self, node: str, *, saga_id: str) -> None:
        """Start the out-of-service clock: a node still not Ready ``out_of_service_after_s``
        later gets ``node.kubernetes.io/out-of-service=powerguard:NoExecute``."""
        self._cancel_timer(node)
        self._off_timers[node] = asyncio.create_task(self._out_of_service(node))

    async def _out_of_service(self, node: str) -> None:
        await asyncio.sleep(self.opts.out_of_service_after_s)
        try:
            if not ko.ready(await self.api.get("Node", self._node(node))):
                await self._taints(
                    self._node(node),
                    lambda t: ko.with_taint(t, ko.OUT_OF_SERVICE, ko.OUT_OF_SERVICE_VALUE, "NoExecute"),
                )
                log.warning(
                    "node %s off for %.0fs: tainted %s:NoExecute (its pods and volumes released)",
                    node,
                    self.opts.out_of_service_after_s,
                    ko.OUT_OF_SERVICE,
                )
        except SchedulerError as exc:
            log.error("node %s: the out-of-service taint failed: %s", node, exc)

    async def node_restored(self, node: str, *, saga_id: str) -> None:
        self._cancel_timer(node)
        name = self._node(node)
        await self.wait_ready(name)
        drop = [(ko.ON_BATTERY, None), (ko.OUT_OF_SERVICE, ko.OUT_OF_SERVICE_VALUE)]
        await self._taints(name, lambda t: ko.without_taints(t, drop))

    async def wait_ready(self, name: str) -> None:
        """Until the node reports Ready (KubeApi.wait_ready), bounded by ready_timeout_s."""
        await self.api.wait_ready(name, self.opts.ready_timeout_s)
