"""A simulated Kubernetes API server with its controllers and kubelets, for the simulated site:

    python -m powerguard.sim.kube --port 6443 --dir /tmp/kube --node n1=/tmp/site/bmc-n1.json \\
        --node n2=/tmp/site/bmc-n2.json --node-label powerguard.io/ups=ups-a \\
        --role power-control=deploy/kubernetes/rbac.yaml

Speaks the Kubernetes API over HTTPS (JSON; its CA in ``<dir>/ca.crt``) for the resources PowerGuard uses (nodes, pods,
eviction, events, jobs, PodDisruptionBudgets, JobSet, Kueue's Workload/ClusterQueue/LocalQueue,
Kubeflow's TrainJob), checked with kubectl and the Python clients. Writes ``<dir>/admin.kubeconfig``
and one kubeconfig per ``--role`` user (bound to that manifest's ClusterRole rules), the audit log
``<dir>/audit.log`` (one audit.k8s.io/v1 Event per write) and the pods' output under ``<dir>/pods/``.
A node's ``Ready`` follows its power state file (the simulated BMC's). ``POST /debug/compact``
(admin) compacts the history: open watches end and resume with 410 Gone.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import signal
import ssl
import sys
import time
from pathlib import Path

import yaml
from aiohttp import web

from . import certs
from .controllers import POWER_STATE, Controllers
from .rbac import User, role_rules
from .resources import BY_KIND
from .server import ApiServer
from .store import Store

ADMIN = "kubernetes-admin"
NODE_INFO = {  # every field the API declares required (the Python client checks them)
    "architecture": "amd64",
    "bootID": "sim",
    "containerRuntimeVersion": "sim://1",
    "kernelVersion": "6.1",
    "kubeProxyVersion": "v1.33.0",
    "kubeletVersion": "v1.33.0",
    "machineID": "sim",
    "operatingSystem": "linux",
    "osImage": "PowerGuard simulated node",
    "systemUUID": "sim",
}


def kubeconfig(url: str, ca: Path, user: str, token: str) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "sim",
            "clusters": [{"name": "sim", "cluster": {"server": url, "certificate-authority": str(ca)}}],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": "sim", "context": {"cluster": "sim", "user": user, "namespace": "default"}}],
        }
    )


def seed(store: Store, nodes: list[str], node_labels: list[str]) -> None:
    for ns in ("default", "kube-system", "powerguard"):
        store.create(BY_KIND["Namespace"], "", {"metadata": {"name": ns}, "status": {"phase": "Active"}})
    labels = dict(lbl.split("=", 1) for lbl in node_labels)
    for spec in nodes:
        name, _, state = spec.partition("=")
        meta = {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", **labels}}
        if state:
            meta["annotations"] = {POWER_STATE: state}
        store.create(
            BY_KIND["Node"], "", {"metadata": meta, "spec": {}, "status": {"conditions": [], "nodeInfo": NODE_INFO}}
        )


def prepare(args: argparse.Namespace) -> tuple[Store, dict[str, User], ssl.SSLContext]:
    """The store seeded with namespaces and nodes, the users (admin and one per ``--role``,
    each with its kubeconfig written), the TLS context."""
    args.dir.mkdir(parents=True, exist_ok=True)
    store = Store(clock=time.time, history=args.history, audit=args.dir / "audit.log")
    seed(store, args.node, args.node_label)
    admin = secrets.token_hex(16)
    users = {admin: User(ADMIN)}
    url = f"https://{args.host}:{args.port}"
    ca, cert, key = certs.make(args.dir, args.host)
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, key)
    (args.dir / "admin.kubeconfig").write_text(kubeconfig(url, ca, ADMIN, admin))
    for spec in args.role:
        name, _, manifest = spec.partition("=")
        token = secrets.token_hex(16)
        rules = role_rules(list(yaml.safe_load_all(Path(manifest).read_text())))
        users[token] = User(f"system:serviceaccount:powerguard:{name}", rules)
        (args.dir / f"{name}.kubeconfig").write_text(kubeconfig(url, ca, name, token))
    return store, users, tls


async def serve(args: argparse.Namespace) -> int:
    store, users, tls = prepare(args)
    url = f"https://{args.host}:{args.port}"
    server = ApiServer(store, users, bookmark_s=args.bookmark_s)
    ctl = Controllers(store, args.dir / "pods")
    runner = web.AppRunner(server.app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, args.host, args.port, ssl_context=tls).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"kube-apiserver (simulated) listening on {url}", flush=True)
    try:
        while not stop.is_set():
            ctl.tick()
            try:
                await asyncio.wait_for(stop.wait(), args.tick_s)
            except TimeoutError:
                pass
    finally:
        ctl.stop()
        for q in list(store.watchers):  # open watches end (their clients see the stream close)
            q.put_nowait(None)
        await runner.cleanup()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m powerguard.sim.kube",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=6443)
    p.add_argument("--dir", type=Path, required=True, help="kubeconfigs, audit.log, pods' output")
    p.add_argument(
        "--node",
        action="append",
        default=[],
        metavar="NAME[=STATE_FILE]",
        help="a node; Ready follows the power in its BMC state file (always Ready without one)",
    )
    p.add_argument("--node-label", action="append", default=[], metavar="KEY=VALUE", help="a label of every node")
    p.add_argument(
        "--role",
        action="append",
        default=[],
        metavar="USER=MANIFEST",
        help="a user bound to the ClusterRole rules in MANIFEST (its kubeconfig: <dir>/USER.kubeconfig)",
    )
    p.add_argument("--history", type=int, default=1000, help="changes kept for watches to resume from")
    p.add_argument("--bookmark-s", type=float, default=1.0, help="BOOKMARK interval of watches that allow them")
    p.add_argument("--tick-s", type=float, default=0.1, help="the controllers' reconcile interval")
    return asyncio.run(serve(p.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
