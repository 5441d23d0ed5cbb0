"""The Kubernetes API as the kubernetes adapter uses it (lightkube's AsyncClient): objects as
plain dicts, each error a SchedulerError naming what was asked and what the API answered (a
403 names the verb, resource and group refused), Events that never fail a step, an eviction's
refusal in its PodDisruptionBudget's words, a node's Ready awaited by a watch relisted after
410 Gone. Owns its client; nothing here decides what to do."""

from __future__ import annotations

import asyncio
import logging
import time

from ..errors import KubeApiError, SchedulerError
from . import kube_objects as ko

log = logging.getLogger("powerguard.power_control.schedulers.kubernetes")

CUSTOM = {
    "JobSet": ("jobset.x-k8s.io", "v1alpha2", "jobsets", True),
    "TrainJob": ("trainer.kubeflow.org", "v1alpha1", "trainjobs", True),
    "Workload": ("kueue.x-k8s.io", "v1beta1", "workloads", True),
    "ClusterQueue": ("kueue.x-k8s.io", "v1beta1", "clusterqueues", False),
}
NAMESPACED = ("Pod", "Workload", "JobSet", "TrainJob", "Job")


def resource(kind: str):
    """The lightkube resource of a kind (core ones typed, the custom ones generic)."""
    from lightkube.generic_resource import create_global_resource, create_namespaced_resource
    from lightkube.resources.batch_v1 import Job
    from lightkube.resources.core_v1 import Event, Node, Pod

    if kind in CUSTOM:
        group, version, plural, namespaced = CUSTOM[kind]
        make = create_namespaced_resource if namespaced else create_global_resource
        return make(group, version, kind, plural)
    return {"Node": Node, "Pod": Pod, "Job": Job, "Event": Event}[kind]


class KubeApi:
    def __init__(self, kubeconfig: str | None, context: str | None, timeout_s: float, instance: str) -> None:
        self.kubeconfig, self.context, self.timeout_s, self.instance = kubeconfig, context, timeout_s, instance
        self._client = None
        self.relists = 0  # watches that were answered 410 Gone and listed again

    def client(self):
        if self._client is None:
            import httpx2
            from lightkube import AsyncClient, KubeConfig

            logging.getLogger("httpx2").setLevel(logging.WARNING)  # not a line per request in the service's log
            config = KubeConfig.from_file(self.kubeconfig) if self.kubeconfig else KubeConfig.from_env()
            self._client = AsyncClient(
                config=config.get(self.context),
                timeout=httpx2.Timeout(self.timeout_s),
                field_manager="powerguard",
            )
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()

    async def _call(self, what: str, coro):
        """An API call; its error as a SchedulerError naming what was asked and what the API said."""
        from httpx2 import HTTPError
        from lightkube import ApiError

        try:
            return await coro
        except ApiError as exc:
            hint = (
                " (the shipped ClusterRole, packaging/kubernetes/rbac.yaml, grants it: is it applied and bound?)"
                if exc.status.code == 403
                else ""
            )
            code = exc.status.code
            raise KubeApiError(f"kubernetes: {what}: {code} {exc.status.message}{hint}", code) from None
        except HTTPError as exc:
            raise SchedulerError(f"kubernetes: {what}: {type(exc).__name__}: {exc}") from None

    # ------------------------------------------------------------ resources
    async def get(self, kind: str, name: str, namespace: str | None = None) -> dict:
        res = resource(kind)
        kw = {"namespace": namespace} if namespace else {}
        obj = await self._call(f"get {kind} {name}", self.client().get(res, name, **kw))
        return obj.to_dict()

    async def list(
        self, kind: str, *, namespace: str | None = None, labels: dict | None = None, fields: dict | None = None
    ) -> list[dict]:
        res = resource(kind)
        kw = {"namespace": namespace} if namespace else ({"namespace": "*"} if kind in NAMESPACED else {})

        async def collect() -> list[dict]:
            return [o.to_dict() async for o in self.client().list(res, labels=labels, fields=fields, **kw)]

        return await self._call(f"list {kind}", collect())

    async def patch(self, kind: str, name: str, patch, *, namespace: str | None = None, json_patch: bool = False):
        from lightkube.types import PatchType

        kw = {"namespace": namespace} if namespace else {}
        return await self._call(
            f"patch {kind} {name}",
            self.client().patch(
                resource(kind), name, patch, patch_type=PatchType.JSON if json_patch else PatchType.MERGE, **kw
            ),
        )

    async def event(self, obj: dict, reason: str, message: str) -> None:
        from lightkube.resources.core_v1 import Event

        body = ko.event(obj, reason, message, instance=self.instance, now=time.time())
        try:
            await self._call(
                f"create Event {reason}",
                self.client().create(Event.from_dict(body), namespace=body["metadata"]["namespace"]),
            )
        except SchedulerError as exc:  # an Event is a report, never a reason to fail the step
            log.warning("%s", exc)

    async def evict(self, pod: dict) -> str | None:
        """Evict one pod; None when done, else why not (a PodDisruptionBudget's own words)."""
        from lightkube import ApiError
        from lightkube.models.meta_v1 import ObjectMeta
        from lightkube.resources.core_v1 import Pod

        name, ns = pod["metadata"]["name"], pod["metadata"]["namespace"]
        body = Pod.Eviction(metadata=ObjectMeta(name=name, namespace=ns))
        try:
            await self.client().create(body, name=name, namespace=ns)
            return None
        except ApiError as exc:
            if exc.status.code == 404:
                return None
            details = exc.status.details.to_dict() if exc.status.details else None
            return (
                f"pod {ns}/{name}: eviction refused ({exc.status.code}): {ko.refused_by(details, exc.status.message)}"
            )

    async def wait_ready(self, name: str, timeout_s: float) -> None:
        """Until the node reports Ready: one list, then a watch from its resourceVersion; a 410
        Gone (the history compacted under the watch) lists again. Bounded by ``timeout_s``."""
        from lightkube import ApiError
        from lightkube.resources.core_v1 import Node

        async def watch() -> None:
            while True:
                nodes = self.client().list(Node, fields={"metadata.name": name})
                found = [n async for n in nodes]
                if found and ko.ready(found[0].to_dict()):
                    return
                try:
                    async for kind, obj in self.client().watch(
                        Node, fields={"metadata.name": name}, resource_version=nodes.resourceVersion
                    ):
                        if kind in ("ADDED", "MODIFIED") and ko.ready(obj.to_dict()):
                            return
                except ApiError as exc:
                    if exc.status.code != 410:
                        raise
                    self.relists += 1
                    log.info("node %s: watch answered 410 Gone; listing again", name)

        try:
            await asyncio.wait_for(self._call(f"watch Node {name}", watch()), timeout_s)
        except TimeoutError:
            raise SchedulerError(f"kubernetes: node {name} not Ready {timeout_s:.0f}s after power-on") from None
