"""The simulated cluster's control plane and kubelets, one reconcile pass at a time over the
store (``Controllers.tick``, called by the server's loop every ``tick_s``):

- nodes: ``Ready`` follows the node's simulated power (the BMC state file named by the node's
  ``sim.powerguard.io/power-state`` annotation): a powered-off node goes NotReady;
- the scheduler binds pending pods to Ready, schedulable nodes whose taints they tolerate;
- kubelets run each bound pod's container as a real process (``$(VAR)`` expanded, ``fieldRef``
  env), report Running/Succeeded/Failed, and on deletion send SIGTERM, then SIGKILL after the
  grace period, then remove the pod; a node that is off runs nothing and removes nothing;
- ``node.kubernetes.io/out-of-service:NoExecute`` on a NotReady node: its pods are force-deleted;
- JobSet: one Job per replica, one pod per Job; ``spec.suspend`` deletes the pods (the JobSet and
  its Jobs stay), resuming recreates them; a failed pod restarts the JobSet up to
  ``failurePolicy.maxRestarts``;
- Kueue: a JobSet labelled ``kueue.x-k8s.io/queue-name`` gets a Workload; an active Workload is
  admitted (the JobSet unsuspended) unless its ClusterQueue's ``stopPolicy`` holds; an inactive
  one is evicted (the JobSet suspended);
- the garbage collector deletes what an owner no longer exists for."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from .api import Api
from .errors import ApiError
from .resources import BY_KIND
from .store import Store, now_iso

NODES, PODS, JOBS, JOBSETS = BY_KIND["Node"], BY_KIND["Pod"], BY_KIND["Job"], BY_KIND["JobSet"]
WORKLOADS, CQS, LQS = BY_KIND["Workload"], BY_KIND["ClusterQueue"], BY_KIND["LocalQueue"]
POWER_STATE = "sim.powerguard.io/power-state"
OUT_OF_SERVICE = "node.kubernetes.io/out-of-service"
JS_NAME, JS_RJ, JS_INDEX = (
    "jobset.sigs.k8s.io/jobset-name",
    "jobset.sigs.k8s.io/replicatedjob-name",
    "jobset.sigs.k8s.io/job-index",
)
QUEUE = "kueue.x-k8s.io/queue-name"
CM, SCHED, KUEUE, JOBSET = (
    "system:kube-controller-manager",
    "system:kube-scheduler",
    "system:serviceaccount:kueue-system:kueue",
    "system:serviceaccount:jobset-system:jobset",
)


@dataclass
class Running:
    proc: subprocess.Popen
    term_at: float | None = None


@dataclass
class Controllers:
    store: Store
    log_dir: Path
    running: dict[str, Running] = field(default_factory=dict)  # pod uid -> its process

    def __post_init__(self) -> None:
        self.api = Api(self.store)

    def tick(self) -> None:
        for step in (
            self._nodes,
            self._out_of_service,
            self._kueue,
            self._jobsets,
            self._schedule,
            self._kubelets,
            self._collect,
        ):
            try:
                step()
            except ApiError as exc:  # a conflict with a client's write: the next pass sees the new state
                if exc.code not in (404, 409):
                    raise

    def stop(self) -> None:
        for r in self.running.values():
            _signal(r.proc, signal.SIGKILL)
        for r in self.running.values():
            r.proc.wait()

    # ------------------------------------------------------------ nodes
    def _powered(self, node: dict) -> bool:
        path = (node["metadata"].get("annotations") or {}).get(POWER_STATE)
        if not path:
            return True
        try:
            return json.loads(Path(path).read_text()).get("power") == "on"
        except (OSError, ValueError):
            return False

    def _nodes(self) -> None:
        for node in self.store.list(NODES, None):
            want = "True" if self._powered(node) else "Unknown"
            status = node.get("status") or {}
            conds = status.get("conditions") or []
            ready = next((c for c in conds if c.get("type") == "Ready"), None)
            if ready is not None and ready.get("status") == want:
                continue
            stamp = now_iso(self.store.clock())
            cond = {
                "type": "Ready",
                "status": want,
                "lastHeartbeatTime": stamp,
                "lastTransitionTime": stamp,
                "reason": "KubeletReady" if want == "True" else "NodeStatusUnknown",
                "message": "kubelet is posting ready status"
                if want == "True"
                else "Kubelet stopped posting node status.",
            }
            node["status"] = {**status, "conditions": [c for c in conds if c.get("type") != "Ready"] + [cond]}
            self.api.update(
                CM if want != "True" else f"system:node:{node['metadata']['name']}",
                NODES,
                "",
                node["metadata"]["name"],
                node,
                sub="status",
            )

    def _ready(self) -> dict[str, dict]:
        return {n["metadata"]["name"]: n for n in self.store.list(NODES, None) if _is_ready(n)}

    def _out_of_service(self) -> None:
        for node in self.store.list(NODES, None):
            taints = (node.get("spec") or {}).get("taints") or []
            if _is_ready(node) or not any(
                t.get("key") == OUT_OF_SERVICE and t.get("effect") == "NoExecute" for t in taints
            ):
                continue
            name = node["metadata"]["name"]
            for pod in self.store.list(PODS, None, lambda p, n=name: (p.get("spec") or {}).get("nodeName") == n):
                self._forget(pod)
                self.store.remove(PODS, pod["metadata"]["namespace"], pod["metadata"]["name"])
                self.store.record(
                    user=CM,
                    verb="delete",
                    res=PODS,
                    ns=pod["metadata"]["namespace"],
                    name=pod["metadata"]["name"],
                    sub="",
                    code=200,
                    detail="out-of-service",
                )

    # ------------------------------------------------------------ Kueue
    def _kueue(self) -> None:
        for js in self.store.list(JOBSETS, None, lambda o: QUEUE in (o["metadata"].get("labels") or {})):
            ns, name = js["metadata"]["namespace"], js["metadata"]["name"]
            wl_name = f"jobset-{name}"
            wl = self.store.find(WORKLOADS, ns, wl_name)
            if wl is None:
                owner = _owner(js)
                self.api.create(
                    KUEUE,
                    WORKLOADS,
                    ns,
                    {
                        "metadata": {
                            "name": wl_name,
                            "ownerReferences": [owner],
                            "labels": dict(js["metadata"].get("labels") or {}),
                        },
                        "spec": {"queueName": js["metadata"]["labels"][QUEUE], "active": True},
                    },
                )
                continue
            admitted = bool((wl.get("status") or {}).get("admission"))
            active = (wl.get("spec") or {}).get("active", True)
            suspended = bool((js.get("spec") or {}).get("suspend"))
            if not active:
                if admitted:
                    wl["status"] = {"conditions": [_cond("Evicted", "True", "InactiveWorkload")]}
                    self.api.update(KUEUE, WORKLOADS, ns, wl_name, wl, sub="status")
                if not suspended:
                    self.api.patch(
                        KUEUE, JOBSETS, ns, name, "application/merge-patch+json", {"spec": {"suspend": True}}
                    )
                continue
            cq = self._cluster_queue(ns, wl["spec"].get("queueName", ""))
            if not admitted:
                if cq is None or (cq.get("spec") or {}).get("stopPolicy", "None") != "None":
                    continue  # held (or no queue): nothing new is admitted
                wl["status"] = {
                    "admission": {"clusterQueue": cq["metadata"]["name"]},
                    "conditions": [_cond("Admitted", "True", "Admitted")],
                }
                self.api.update(KUEUE, WORKLOADS, ns, wl_name, wl, sub="status")
                admitted = True
            if admitted and suspended:
                self.api.patch(KUEUE, JOBSETS, ns, name, "application/merge-patch+json", {"spec": {"suspend": False}})

    def _cluster_queue(self, ns: str, local: str) -> dict | None:
        lq = self.store.find(LQS, ns, local)
        return self.store.find(CQS, "", (lq.get("spec") or {}).get("clusterQueue", "")) if lq else None

    # ------------------------------------------------------------ JobSet
    def _jobsets(self) -> None:
        for js in self.store.list(JOBSETS, None):
            ns, name = js["metadata"]["namespace"], js["metadata"]["name"]
            if js["metadata"].get("deletionTimestamp"):
                continue
            pods = self.store.list(PODS, ns, lambda p, n=name: (p["metadata"].get("labels") or {}).get(JS_NAME) == n)
            status = dict(js.get("status") or {})
            done = any(
                c.get("type") in ("Completed", "Failed") and c.get("status") == "True"
                for c in status.get("conditions", [])
            )
            suspended = bool((js.get("spec") or {}).get("suspend"))
            if suspended:
                for p in pods:
                    if not p["metadata"].get("deletionTimestamp"):
                        self.api.delete(JOBSET, PODS, ns, p["metadata"]["name"])
                self._js_status(js, status, "Suspended", "True", "JobSetSuspended")
                continue
            if done:
                continue
            self._js_status(js, status, "Suspended", "False", "JobSetResumed")
            live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
            failed = [p for p in live if (p.get("status") or {}).get("phase") == "Failed"]
            if failed:
                restarts = status.get("restarts", 0)
                if restarts >= ((js["spec"].get("failurePolicy") or {}).get("maxRestarts", 0)):
                    self._js_status(js, status, "Failed", "True", "ReachedMaxRestarts")
                else:
                    for p in live:
                        self.api.delete(JOBSET, PODS, ns, p["metadata"]["name"])
                    js = self.store.get(JOBSETS, ns, name)
                    js["status"] = {**(js.get("status") or {}), "restarts": restarts + 1}
                    self.api.update(JOBSET, JOBSETS, ns, name, js, sub="status")
                continue
            if any(p["metadata"].get("deletionTimestamp") for p in pods):
                continue  # a restart or a resume waits for the old pods to be gone
            wanted = self._wanted_jobs(js)
            if (
                live
                and len(live) == len(wanted)
                and all((p.get("status") or {}).get("phase") == "Succeeded" for p in live)
            ):
                self._js_status(js, status, "Completed", "True", "AllJobsCompleted")
                continue
            have = {(p["metadata"]["labels"].get(JS_RJ), p["metadata"]["labels"].get(JS_INDEX)) for p in live}
            for rj, index, template in wanted:
                if (rj["name"], str(index)) not in have:
                    self._create_pod(js, rj, index, template)

    def _wanted_jobs(self, js: dict) -> list[tuple[dict, int, dict]]:
        out = []
        for rj in (js.get("spec") or {}).get("replicatedJobs") or []:
            for i in range(int(rj.get("replicas", 1))):
                out.append((rj, i, ((rj.get("template") or {}).get("spec") or {}).get("template") or {}))
        return out

    def _create_pod(self, js: dict, rj: dict, index: int, template: dict) -> None:
        ns, name = js["metadata"]["namespace"], js["metadata"]["name"]
        job_name = f"{name}-{rj['name']}-{index}"
        job = self.store.find(JOBS, ns, job_name)
        if job is None:
            owner = _owner(js)
            job = self.api.create(
                JOBSET,
                JOBS,
                ns,
                {
                    "metadata": {
                        "name": job_name,
                        "ownerReferences": [owner],
                        "labels": {JS_NAME: name, JS_RJ: rj["name"], JS_INDEX: str(index)},
                    },
                    "spec": (rj.get("template") or {}).get("spec") or {},
                },
            )
        meta = template.get("metadata") or {}
        labels = {
            **(meta.get("labels") or {}),
            JS_NAME: name,
            JS_RJ: rj["name"],
            JS_INDEX: str(index),
            "batch.kubernetes.io/job-completion-index": "0",
            "job-name": job_name,
        }
        owner = _owner(job)
        spec = json.loads(json.dumps(template.get("spec") or {}))
        self.api.create(
            CM,
            PODS,
            ns,
            {
                "metadata": {
                    "generateName": f"{job_name}-0-",
                    "labels": labels,
                    "annotations": dict(meta.get("annotations") or {}),
                    "ownerReferences": [owner],
                },
                "spec": spec,
                "status": {"phase": "Pending"},
            },
        )

    def _js_status(self, js: dict, status: dict, type_: str, value: str, reason: str) -> None:
        conds = status.get("conditions") or []
        cur = next((c for c in conds if c.get("type") == type_), None)
        if cur is not None and cur.get("status") == value:
            return
        status["conditions"] = [c for c in conds if c.get("type") != type_] + [_cond(type_, value, reason)]
        js = self.store.get(JOBSETS, js["metadata"]["namespace"], js["metadata"]["name"])
        js["status"] = status
        self.api.update(JOBSET, JOBSETS, js["metadata"]["namespace"], js["metadata"]["name"], js, sub="status")

    # ------------------------------------------------------------ scheduler
    def _schedule(self) -> None:
        """Bind each pending pod to a Ready node it fits, spreading a JobSet's pods (the node
        with the fewest of its pods; ties by name)."""
        ready = self._ready()
        pods = self.store.list(PODS, None)
        placed: dict[tuple[str, str | None], int] = {}
        for p in pods:
            if node := (p.get("spec") or {}).get("nodeName"):
                key = (node, (p["metadata"].get("labels") or {}).get(JS_NAME))
                placed[key] = placed.get(key, 0) + 1
        for pod in pods:
            spec = pod.get("spec") or {}
            if spec.get("nodeName") or pod["metadata"].get("deletionTimestamp"):
                continue
            fits = [n["metadata"]["name"] for n in ready.values() if _fits(pod, n)]
            if not fits:
                continue
            js = (pod["metadata"].get("labels") or {}).get(JS_NAME)
            node = min(fits, key=lambda n, js=js: (placed.get((n, js), 0), n))
            placed[(node, js)] = placed.get((node, js), 0) + 1
            pod["spec"]["nodeName"] = node
            self.api.update(SCHED, PODS, pod["metadata"]["namespace"], pod["metadata"]["name"], pod)

    # ------------------------------------------------------------ kubelets
    def _kubelets(self) -> None:
        ready = self._ready()
        now = self.store.clock()
        for pod in self.store.list(PODS, None):
            node = (pod.get("spec") or {}).get("nodeName")
            if not node or node not in ready:
                continue  # unbound, or its node is off: no kubelet acts on it
            uid, ns, name = pod["metadata"]["uid"], pod["metadata"]["namespace"], pod["metadata"]["name"]
            run = self.running.get(uid)
            phase = (pod.get("status") or {}).get("phase", "Pending")
            if pod["metadata"].get("deletionTimestamp"):
                if run is not None and run.proc.poll() is None:
                    if run.term_at is None:
                        run.term_at = now
                        _signal(run.proc, signal.SIGTERM)
                    elif now - run.term_at >= pod["metadata"].get("deletionGracePeriodSeconds", 30):
                        _signal(run.proc, signal.SIGKILL)
                    continue
                self._forget(pod)
                self.store.remove(PODS, ns, name)
                self.store.record(
                    user=f"system:node:{node}",
                    verb="delete",
                    res=PODS,
                    ns=ns,
                    name=name,
                    sub="",
                    code=200,
                    detail="terminated",
                )
                continue
            if run is None and phase == "Pending":
                self._start(pod, node)
                continue
            if run is not None and phase == "Running" and (rc := run.proc.poll()) is not None:
                pod["status"] = {
                    **pod["status"],
                    "phase": "Succeeded" if rc == 0 else "Failed",
                    "conditions": [_cond("Ready", "False", "PodCompleted")],
                    "containerStatuses": [_container_status(pod, {"terminated": {"exitCode": rc}}, ready=False)],
                }
                self.api.update(f"system:node:{node}", PODS, ns, name, pod, sub="status")

    def _start(self, pod: dict, node: str) -> None:
        c = _container(pod)
        env = {"NODE_NAME": node}
        for e in c.get("env") or []:
            if "value" in e:
                env[e["name"]] = _expand(str(e["value"]), env)
            elif ref := ((e.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath"):
                env[e["name"]] = _field(pod, ref)
        argv = [_expand(a, env) for a in [*(c.get("command") or []), *(c.get("args") or [])]]
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_dir / f"{ns}_{name}.log", "ab") as log:
            try:
                proc = subprocess.Popen(
                    argv,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=c.get("workingDir") or None,
                    env={**os.environ, **env},
                    start_new_session=True,
                )
            except OSError as exc:
                pod["status"] = {"phase": "Failed", "message": f"cannot start {argv[:1]}: {exc.strerror}"}
                self.api.update(f"system:node:{node}", PODS, ns, name, pod, sub="status")
                return
        self.running[pod["metadata"]["uid"]] = Running(proc)
        pod["status"] = {
            "phase": "Running",
            "podIP": "127.0.0.1",
            "hostIP": "127.0.0.1",
            "startTime": now_iso(self.store.clock()),
            "conditions": [_cond("Ready", "True", "")],
            "containerStatuses": [
                _container_status(pod, {"running": {"startedAt": now_iso(self.store.clock())}}, ready=True)
            ],
        }
        self.api.update(f"system:node:{node}", PODS, ns, name, pod, sub="status")

    def _forget(self, pod: dict) -> None:
        run = self.running.pop(pod["metadata"]["uid"], None)
        if run is not None and run.proc.poll() is None:
            _signal(run.proc, signal.SIGKILL)
            run.proc.wait()

    # ------------------------------------------------------------ garbage collector
    def _collect(self) -> None:
        uids = {o["metadata"]["uid"] for o in self.store.objects.values()}
        for (key, ns, name), obj in list(self.store.objects.items()):
            owners = obj["metadata"].get("ownerReferences") or []
            if owners and not any(o.get("uid") in uids for o in owners):
                res = next(r for r in BY_KIND.values() if r.key == key)
                if not obj["metadata"].get("deletionTimestamp"):
                    self.api.delete("system:serviceaccount:kube-system:generic-garbage-collector", res, ns, name)


def _owner(obj: dict) -> dict:
    """The ownerReference of a controller's object to ``obj`` (what the garbage collector follows)."""
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": obj["metadata"]["name"],
        "uid": obj["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _is_ready(node: dict) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (node.get("status") or {}).get("conditions") or []
    )


def _fits(pod: dict, node: dict) -> bool:
    spec, nspec = pod.get("spec") or {}, node.get("spec") or {}
    if nspec.get("unschedulable"):
        return False
    labels = node["metadata"].get("labels") or {}
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    tolerations = spec.get("tolerations") or []
    for t in nspec.get("taints") or []:
        if t.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if not any(_tolerates(tol, t) for tol in tolerations):
            return False
    return True


def _tolerates(tol: dict, taint: dict) -> bool:
    if tol.get("effect") and tol["effect"] != taint.get("effect"):
        return False
    if tol.get("operator") == "Exists":
        return not tol.get("key") or tol["key"] == taint.get("key")
    return tol.get("key") == taint.get("key") and tol.get("value", "") == taint.get("value", "")


def _container(pod: dict) -> dict:
    return ((pod.get("spec") or {}).get("containers") or [{}])[0]


_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def _expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion in command, args and env values (unknown ones stay)."""
    return _VAR.sub(lambda m: env.get(m.group(1), m.group(0)), text)


def _field(pod: dict, path: str) -> str:
    meta = pod["metadata"]
    if m := re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path):
        return (meta.get(m.group(1)) or {}).get(m.group(2), "")
    return {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": (pod.get("spec") or {}).get("nodeName", ""),
        "status.podIP": "127.0.0.1",
    }.get(path, "")


def _container_status(pod: dict, state: dict, *, ready: bool) -> dict:
    """A ContainerStatus with every field the API declares required (clients check them)."""
    c = _container(pod)
    return {
        "name": c.get("name", "main"),
        "image": c.get("image", "sim"),
        "imageID": "",
        "ready": ready,
        "restartCount": 0,
        "started": ready,
        "state": state,
    }


def _cond(type_: str, status: str, reason: str) -> dict:
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": "",
        "lastTransitionTime": now_iso(time.time()),
    }


def _signal(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
