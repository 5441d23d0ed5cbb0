"""A simulated large site for the scale benchmarks: ranks laid out on nodes and jobs, the agent
registry and topology the coordinator would hold, and a 3-node nats-server cluster."""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

PER_NODE = 8  # ranks per node
JOB_RANKS = 4096  # ranks per job (the last job takes the rest)


@dataclass(frozen=True)
class Layout:
    nodes: list[str]
    jobs: dict[str, int]  # job -> world size
    on: dict[str, list[tuple[str, int]]]  # node -> [(job, rank)]

    @classmethod
    def of(cls, ranks: int) -> Layout:
        nodes = [f"gpu{i:05d}" for i in range(ranks // PER_NODE)]
        jobs: dict[str, int] = {}
        on: dict[str, list[tuple[str, int]]] = {n: [] for n in nodes}
        for start in range(0, ranks, JOB_RANKS):
            job, size = f"job{start // JOB_RANKS:03d}", min(JOB_RANKS, ranks - start)
            jobs[job] = size
            for r in range(size):
                on[nodes[(start + r) // PER_NODE]].append((job, r))
        return cls(nodes, jobs, on)

    def registry(self):
        from powerguard.coordinator.topology import AgentRegistry
        from powerguard.schemas import AgentData

        reg = AgentRegistry()
        for node, ranks in self.on.items():
            for job, r in ranks:
                reg.update(AgentData(job=job, rank=r, world_size=self.jobs[job], node=node, step=1000))
        return reg

    def topology(self):
        from powerguard.coordinator.topology import Topology

        return Topology(site="bench", feeds={n: ("ups-a",) for n in self.nodes})


def durable_ack(job: str, rank: int, world_size: int | None, request_id: str, saga_id: str, *, for_job: bool = False):
    """A rank's durable ack to its job's checkpoint request, as its agent sends it; ``for_job``:
    rank 0's one ack for every rank of the job (a request that asked for one ack per job)."""
    from powerguard.schemas import CheckpointDurable, CheckpointDurableData

    return CheckpointDurable(
        data=CheckpointDurableData(
            request_id=request_id,
            saga_id=saga_id,
            job=job,
            rank=rank,
            world_size=world_size,
            step=1001,
            path="/ckpt",
            bytes=1,
            digest="0" * 32,
            ranks=[(0, world_size - 1)] if for_job and world_size else None,
        )
    )


def site_args(description: str, results: Path) -> argparse.ArgumentParser:
    """The options every scale benchmark takes: the site sizes and the results file."""
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="10000,100000", help="comma-separated site sizes (default: 10000,100000)")
    ap.add_argument("--out", type=Path, default=results, help=f"results file (default: {results})")
    return ap


@contextmanager
def nats_servers(sync: str | None = "always") -> Iterator[list]:
    """Three routed nats-servers with JetStream; yields them (each with its ``url`` and ``pid``).
    ``sync``: JetStream's ``sync_interval`` (PowerGuard ships ``always``; None: NATS's default,
    2 minutes)."""
    from powerguard.bus import embedded_cluster

    with tempfile.TemporaryDirectory() as tmp:
        cluster = embedded_cluster(tmp)
        for n in cluster:
            n.sync = sync
        try:
            for n in cluster:
                n.start()
            yield cluster
        finally:
            for n in cluster:
                n.stop()


@contextmanager
def nats_cluster(sync: str | None = "always") -> Iterator[list[str]]:
    """:func:`nats_servers`' URLs."""
    with nats_servers(sync) as servers:
        yield [n.url for n in servers]


def cpu_s(pids: list[int]) -> list[float]:
    """The CPU seconds (user and system) each process has spent so far."""
    import psutil

    return [sum(psutil.Process(p).cpu_times()[:2]) for p in pids]


async def connect(urls: list[str], service: str, names=None):
    """A bus with an R3 stream and buckets, once the new cluster has elected its meta leader."""
    from powerguard.bus import Bus, BusNames, SetupError, StreamLimits

    names = names or BusNames.isolated()
    for attempt in range(10):
        try:
            return await Bus.connect(urls, service=service, names=names, limits=StreamLimits(replicas=3))
        except SetupError:
            if attempt == 9:
                raise
            await asyncio.sleep(2)
    raise AssertionError("unreachable")


async def client_processes(script: str, procs: int, *args: str, stdin: bool = False) -> list:
    """``script --worker P ARGS`` for each P below ``procs`` (the simulated nodes' client
    processes), stdout piped (and stdin, with ``stdin``)."""
    import sys

    return [
        await asyncio.create_subprocess_exec(
            sys.executable,
            script,
            "--worker",
            str(p),
            *args,
            stdin=asyncio.subprocess.PIPE if stdin else None,
            stdout=asyncio.subprocess.PIPE,
        )
        for p in range(procs)
    ]
