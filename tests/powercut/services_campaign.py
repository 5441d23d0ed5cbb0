"""PowerGuard's own state through a power cut (tests with fixed seeds, bench/powercut.py with
many): the broker's JetStream store on the power-cut filesystem (journal mode: what ext4/XFS
keep), the coordinator and power-control as real processes, two nodes behind the project's
simulated IPMI BMCs (their power is outside the cut, as a site's hardware is). At a random
moment of an outage (a seed picks the saga state and an extra delay) everything loses power at
once: the services are SIGKILLed, the broker too, and what it had not made durable is dropped.
Power returns, everything starts again on what the broker kept.

With ``servers=3`` the broker is a 3-node JetStream cluster (R3 stream and buckets), each
server's store on its own power-cut filesystem, all cut at the same instant (one blackout takes
the whole management rack).

Invariants: the saga is still there; it finishes (``done``); every node was powered off once
and on once, as its BMC counts (never a second power cycle, never left off)."""

from __future__ import annotations

import asyncio
import json
import os
import random
from pathlib import Path

import nats
import yaml
from nats.js import errors as js_errors

from powerguard.bus import Bus, BusNames, EmbeddedNats, embedded_cluster
from powerguard.bus.names import StreamLimits
from powerguard.coordinator.store import SagaStore
from tests.integration.coordinator.helpers import POLICY, drain_battery, outage, power_back
from tests.integration.coordinator.process import CoordinatorProcess
from tests.integration.power.peers import PASSWORD, USER, PyghmiBmc

from . import PowerCutFs

STATES = ("holding", "shutting_down", "down", "restoring")


class PowerControlProcess(CoordinatorProcess):
    """``python -m powerguard.power_control`` (the same flags, log lines and kill)."""

    module = "powerguard.power_control"


def _site_file(path: Path, names: BusNames, bmcs: dict[str, PyghmiBmc]) -> Path:
    cred = {"username": {"env": "PG_CUT_BMC_USER"}, "password": {"env": "PG_CUT_BMC_PASSWORD"}}
    cfg = {
        "site": "dc1",
        "nats": {
            "prefix": names.prefix,
            "stream": names.stream,
            "sagas_bucket": names.sagas,
            "status_bucket": names.status,
            "agents_bucket": names.agents,
            "leases_bucket": names.leases,
            "ups_bucket": names.ups,
            "power_bucket": names.power,
        },
        "ups": [{"name": "ups-a", "driver": "nut"}],
        "nodes": [
            {"name": n, "feeds": ["ups-a"], "bmc": {"driver": "ipmi", "host": "127.0.0.1", "port": b.port, **cred}}
            for n, b in bmcs.items()
        ],
        "coordinator": {**POLICY, "restore_timeout_s": 120, "shutdown_timeout_s": 60},
        "power_control": {"gather_s": 0.1, "poll_interval_s": 0.1, "soft_off_timeout_s": 3, "device_timeout_s": 5},
    }
    path.write_text(yaml.safe_dump(cfg))
    return path


async def _state(bus: Bus) -> tuple[str | None, str | None]:
    """(saga id, state) of the site's one saga, as the broker has it now."""
    recs = await SagaStore(await bus.sagas()).load()
    return (recs[0][0].saga_id, recs[0][0].state.value) if recs else (None, None)


async def _kept(bus: Bus) -> str:
    """What the sagas bucket holds after the cut (for the violation's message)."""
    try:
        info = await bus.js.stream_info(f"KV_{bus.names.sagas}")
        keys = await (await bus.sagas()).keys() if info.state.messages else []
        st = info.state
        return f"KV_{bus.names.sagas}: {st.messages} messages, seq {st.first_seq}-{st.last_seq}, keys {keys}"
    except Exception as exc:
        return f"KV_{bus.names.sagas}: {type(exc).__name__}: {exc}"


async def _read(bus: Bus, timeout_s: float = 30.0) -> tuple[str | None, str | None]:
    """:func:`_state`, read again while the read itself fails (no answer: after a cut a cluster
    elects each stream's leader before it answers; on a loaded machine that took longer than one
    request's timeout), never past ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        try:
            return await _state(bus)
        except (TimeoutError, nats.errors.Error, js_errors.APIError):
            if loop.time() > deadline:
                raise
            await asyncio.sleep(0.2)


async def _now(bus: Bus) -> tuple[str | None, str | None]:
    """The stored saga now (read again, up to 20 times, while a read finds none)."""
    for _ in range(20):
        got = await _read(bus)
        if got[0] is not None:
            return got
        await asyncio.sleep(0.05)
    return None, None


async def _until(bus: Bus, states: tuple[str, ...], timeout_s: float) -> tuple[str | None, str | None]:
    """Poll the stored saga (the broker's word, not an event) until it is in one of ``states``:
    (saga id, state). A read that finds no saga is polled again, never taken as the answer."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    seen: tuple[str | None, str | None] = (None, None)
    while loop.time() < deadline:
        got = await _read(bus)
        seen = got if got[0] is not None else seen
        if got[1] in states:
            return got
        await asyncio.sleep(0.05)
    return seen


class Brokers:
    """One nats-server, or a 3-node cluster, each server's store on its own power-cut filesystem
    (journal mode: what ext4/XFS keep); cut and started again together."""

    def __init__(self, work: Path, servers: int, sync: str) -> None:
        self.servers = servers
        self.limits = StreamLimits(replicas=servers)
        if servers == 1:
            self.disks = [PowerCutFs(work / "fs", mode="journal").start()]
            self.nodes = [EmbeddedNats(store_dir=self.disks[0].mountpoint / "nats", sync=sync)]
        else:
            self.nodes = embedded_cluster(work / "stores", servers)
            self.disks = [
                PowerCutFs(work / f"fs-{i}", n.store_dir, mode="journal").start() for i, n in enumerate(self.nodes)
            ]
            for n in self.nodes:
                n.sync = sync
        for n in self.nodes:
            n.start()

    @property
    def url(self) -> str:
        return ",".join(n.url for n in self.nodes)

    async def connect(self, names: BusNames, timeout_s: float = 30.0) -> Bus:
        """A connection once JetStream answers (a cluster elects its meta leader first)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            try:
                return await Bus.connect(self.url, service="test", names=names, limits=self.limits)
            except Exception:
                if loop.time() > deadline:
                    raise
                await asyncio.sleep(0.5)

    def cut(self) -> None:
        """Every server loses power at once; what its disk had not made durable is gone."""
        for d in self.disks:  # the disks stop first: nothing written after this instant lands
            if d.proc is not None and d.proc.poll() is None:
                d.proc.kill()
        for n in self.nodes:
            n.kill()
        for d in self.disks:
            d.cut()

    def start(self) -> None:
        for d in self.disks:
            d.start()
        for n in self.nodes:
            n.start()

    def stop(self) -> None:
        for n in self.nodes:
            n.kill()
        for d in self.disks:
            d.stop()


async def services_cut(root: Path, seed: int, *, sync: str = "always", servers: int = 1) -> list[str]:
    """One cut at the state and delay ``seed`` picks; the violations found (empty: none)."""
    rng = random.Random(seed)
    cut_in, extra_s = rng.choice(STATES), round(rng.uniform(0.0, 0.4), 3)
    tag = f"services{'' if servers == 1 else f' ({servers} servers)'} seed {seed} (cut in {cut_in} +{extra_s}s)"
    os.environ.update(PG_CUT_BMC_USER=USER, PG_CUT_BMC_PASSWORD=PASSWORD)
    replicas = os.environ.get("POWERGUARD_NATS_REPLICAS")
    if servers > 1:
        os.environ["POWERGUARD_NATS_REPLICAS"] = str(servers)  # the services' streams and buckets: R3
    work = Path(root) / f"services-{seed}-{servers}"
    work.mkdir(parents=True, exist_ok=True)
    bmcs = {n: PyghmiBmc(work, n, boot_delay=0.5, soft_off_delay=1.0).start() for n in ("n1", "n2")}
    names = BusNames.isolated()
    path = _site_file(work / "site.yaml", names, bmcs)
    brokers = Brokers(work, servers, sync)
    procs: list[CoordinatorProcess] = []
    every: list[CoordinatorProcess] = []  # before and after the cut: their logs kept in ``work``
    bus: Bus | None = None

    async def start_services() -> str | None:
        procs.append(await CoordinatorProcess(path, brokers.url, "c1").start())
        procs.append(await PowerControlProcess(path, brokers.url, "p1").start())
        every.extend(procs[-2:])
        for _ in range(600):
            if procs[-2].said("leads site"):
                return None
            await asyncio.sleep(0.05)
        return f"{tag}: the coordinator never led the site"

    try:
        bus = await brokers.connect(names)
        if why := await start_services():
            return [why]
        await outage(bus, 300)
        await _until(bus, ("holding",), 30)
        if cut_in in ("shutting_down", "down", "restoring"):
            await drain_battery(bus, 40)
        if cut_in == "restoring":
            await _until(bus, ("down",), 30)
            await power_back(bus)
        saga, state = await _until(bus, (cut_in,), 30)
        if state != cut_in:
            return [f"{tag}: the saga never reached {cut_in} before the cut ({state})"]
        await asyncio.sleep(extra_s)

        # the power goes: services and broker at once, unsynced writes dropped
        await bus.close()
        for p in procs:
            await p.kill()
        brokers.cut()

        # power returns: the broker, then the services, start on what was durable
        brokers.start()
        procs.clear()
        bus = await brokers.connect(names)
        again, _ = await _now(bus)  # the saga, if the broker kept it
        if again != saga:
            return [f"{tag}: saga {saga} lost with the power (the broker has {again}; {await _kept(bus)})"]
        if why := await start_services():
            return [why]
        if (await _now(bus))[1] in ("holding", "shutting_down"):
            await drain_battery(bus, 40)  # ups-monitor's readings go on after its restart
            await _until(bus, ("down", "partly_down"), 60)
        await power_back(bus)
        _, state = await _until(bus, ("done", "failed"), 90)
        out = [] if state == "done" else [f"{tag}: saga ended {state}, not done"]
        for n, b in bmcs.items():
            powered = [what for _, what in b.events() if what in ("power off", "power on")]
            if powered != ["power off", "power on"]:
                out.append(f"{tag}: {n} powered {powered} (once off and once on expected)")
            if json.loads(b.state.read_text())["power"] != "on":
                out.append(f"{tag}: {n} left off")
        if out:  # what the saga went through, for the post-mortem (the services' logs are in ``work``)
            recs = await SagaStore(await bus.sagas()).load()
            if recs:
                out.append(
                    f"{tag}: saga history " + "; ".join(f"{t.state.value}: {t.reason}" for t in recs[0][0].history)
                )
        return out
    except Exception as exc:  # a service or the broker not coming back: a violation
        return [f"{tag}: {type(exc).__name__}: {exc}"]
    finally:
        for p in procs:
            await p.kill()
        for i, p in enumerate(every):  # what each service said, for the violation's post-mortem
            lines = "".join(json.dumps(line) + "\n" for line in p.lines)
            (work / f"{i}-{p.module.rsplit('.', 1)[-1]}.log").write_text(lines)
        if bus is not None and bus.nc.is_connected:
            await bus.close()
        brokers.stop()
        for b in bmcs.values():
            b.stop()
        if replicas is None:
            os.environ.pop("POWERGUARD_NATS_REPLICAS", None)
        else:
            os.environ["POWERGUARD_NATS_REPLICAS"] = replicas
