"""The jobs the site knows, kept durable: what an outage needs of a job when the registry has
lost it.

The agent registry (``pg_agents``) is soft state in the servers' memory: a broker restart (the
management host losing power), a record that lapsed past the bucket's TTL (a bus blip), or a
bucket another job filled leaves a running job out of it, and an outage then saw "0 job(s) at
risk" and powered the job's nodes off without a checkpoint request. The book keeps, per job,
what the registry last said of it — its world size, which ranks ran on which of the site's nodes,
its hold policy, when it was last heard and when its credential expires — and the coordinator
stores each job's entry in its own file-stored bucket (``pg_sagas``, key ``job.<site>.<job>``,
written by the coordinator only, fsynced). So after any restart, upgrade or failover:

- an outage still asks every known job on the nodes at risk for its checkpoint (the ranks
  listen on their job's request subject whatever the registry says), and holds the shutdown
  for its acks until the deadline, as for any silent job;
- the job's gauges stay (``powerguard_job_ranks_registered`` 0 of its world), so
  ``PowerGuardAgentsMissing`` keeps firing until the job is back or it ends.

A job leaves the book when its ranks deregister (it ended), or after ``forget_after_s`` without
a word from it (a job that died without deregistering; logged). Each job's entry is bounded by
the coordinator, whatever the job writes: only the site's own compute nodes, ranks below its
world size. Pure: the caller stores what :meth:`JobBook.dirty` returns and injects the clock.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from powerguard.schemas import AgentData, HoldPolicy

from .topology import JobHealth, JobInfo

KEY_PREFIX = "job."
REFRESH_S = 60.0  # a job heard again is stored again at most this often (its last-heard time)


def book_key(site: str, job: str) -> str:
    return f"{KEY_PREFIX}{site}.{job}"


@dataclass
class KnownJob:
    job: str
    world_size: int
    ranks: dict[int, str] = field(default_factory=dict)  # rank -> node (the site's nodes only)
    hold_policy: HoldPolicy | None = None
    heard_at: float = -math.inf  # coordinator clock; -inf: never heard as it happened
    credential_expires: float | None = None
    stored_heard_at: float = -math.inf  # what the stored copy says

    def encode(self) -> bytes:
        spans: dict[str, list[list[int]]] = {}
        for rank in sorted(self.ranks):
            node = self.ranks[rank]
            runs = spans.setdefault(node, [])
            if runs and runs[-1][1] == rank - 1:
                runs[-1][1] = rank
            else:
                runs.append([rank, rank])
        return json.dumps(
            {
                "job": self.job,
                "world_size": self.world_size,
                "nodes": spans,
                "hold_policy": self.hold_policy,
                "heard_at": self.heard_at if math.isfinite(self.heard_at) else None,
                "credential_expires": self.credential_expires,
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(cls, raw: bytes, nodes: frozenset[str]) -> KnownJob:
        d = json.loads(raw)
        world = int(d["world_size"])
        ranks = {
            r: node
            for node, runs in (d.get("nodes") or {}).items()
            if node in nodes
            for first, last in runs
            for r in range(max(0, int(first)), min(int(last), world - 1) + 1)
        }
        heard = d.get("heard_at")
        heard_at = float(heard) if heard is not None else -math.inf
        return cls(
            job=str(d["job"]),
            world_size=world,
            ranks=ranks,
            hold_policy=d.get("hold_policy"),
            heard_at=heard_at,
            credential_expires=d.get("credential_expires"),
            stored_heard_at=heard_at,
        )


class JobBook:
    def __init__(self, nodes: frozenset[str] | set[str], *, forget_after_s: float = 7 * 24 * 3600.0) -> None:
        self.nodes = frozenset(nodes)
        self.forget_after_s = forget_after_s
        self.jobs: dict[str, KnownJob] = {}
        self._dirty: set[str] = set()
        self._gone: set[str] = set()  # ended or forgotten: their stored entries to delete

    # ------------------------------------------------------------------ what the registry says
    def heard(self, agent: AgentData, now: float, *, live: bool = True) -> None:
        """A rank's record (``live``: written as it happened, not a stored one read at start)."""
        if agent.node not in self.nodes:
            return  # a node the site does not have: nothing an outage could put at risk
        known = self.jobs.get(agent.job)
        if known is None or (agent.rank == 0 and known.world_size != agent.world_size):
            # new, or rank 0 (the job's own word for its world) says the world changed: a restart
            known = self.jobs[agent.job] = KnownJob(job=agent.job, world_size=agent.world_size)
            self._dirty.add(agent.job)
        self._gone.discard(agent.job)
        if agent.rank >= known.world_size:
            return
        if known.ranks.get(agent.rank) != agent.node:
            known.ranks[agent.rank] = agent.node
            self._dirty.add(agent.job)
        if agent.rank == 0 and known.hold_policy != agent.hold_policy:
            known.hold_policy = agent.hold_policy
            self._dirty.add(agent.job)
        if agent.credential_expires is not None and known.credential_expires != agent.credential_expires:
            known.credential_expires = min(known.credential_expires or math.inf, agent.credential_expires)
            self._dirty.add(agent.job)
        if live:
            known.heard_at = max(known.heard_at, now)
            if known.heard_at - known.stored_heard_at >= REFRESH_S:
                self._dirty.add(agent.job)

    def ended(self, job: str) -> None:
        """Every rank of ``job`` deregistered: it ended, and leaves the book."""
        if self.jobs.pop(job, None) is not None:
            self._gone.add(job)
        self._dirty.discard(job)

    def forget_silent(self, now: float) -> list[str]:
        """Jobs not heard for ``forget_after_s`` (they died without deregistering) leave the book."""
        out = [j for j, k in self.jobs.items() if math.isfinite(k.heard_at) and now - k.heard_at > self.forget_after_s]
        for job in out:
            self.ended(job)
        return out

    # ------------------------------------------------------------------ storage
    def load(self, stored: dict[str, bytes]) -> None:
        """Entries read back from the store (job -> value), as the book starts."""
        for job, raw in stored.items():
            try:
                known = KnownJob.decode(raw, self.nodes)
            except (ValueError, KeyError, TypeError):
                continue
            if known.job == job and known.ranks:
                self.jobs.setdefault(job, known)

    def mark(self, job: str) -> None:
        """Store ``job``'s entry again (a write that failed)."""
        if job in self.jobs:
            self._dirty.add(job)

    def dirty(self) -> tuple[list[KnownJob], list[str]]:
        """The entries to store and the jobs whose entries to delete since the last call."""
        out = [self.jobs[j] for j in sorted(self._dirty) if j in self.jobs]
        for known in out:
            known.stored_heard_at = known.heard_at
        gone = sorted(self._gone)
        self._dirty.clear()
        self._gone.clear()
        return out, gone

    # ------------------------------------------------------------------ what an outage sees
    def missing(self, live: dict[str, JobInfo]) -> dict[str, JobInfo]:
        """Known jobs the registry does not have now, as the saga takes jobs: each with its ranks
        and when it was last heard (silent: the saga asks it and waits until the deadline)."""
        return {
            name: JobInfo(
                job=name,
                world_size=k.world_size,
                ranks=dict(k.ranks),
                hold_policy=k.hold_policy,
                heard_at=k.heard_at,
            )
            for name, k in self.jobs.items()
            if name not in live and k.ranks
        }

    def complete(self, live: dict[str, JobInfo]) -> dict[str, JobInfo]:
        """The registry's live jobs with the ranks it lacks now filled in from the book (the same
        world): after a registry loss a job's ranks come back one heartbeat at a time, and a job
        known by half its ranks would be asked, stopped and restarted as if it ran on half its
        nodes (restarted once those were ready, before the others had power)."""
        for name, info in live.items():
            known = self.jobs.get(name)
            if known is None or known.world_size != info.world_size or len(info.ranks) >= info.world_size:
                continue
            for rank, node in known.ranks.items():
                info.ranks.setdefault(rank, node)
        return live

    def health(self, registry: dict[str, JobHealth]) -> dict[str, JobHealth]:
        """The registry's job health, and every known job it lacks with 0 ranks heard."""
        out = dict(registry)
        for name, k in self.jobs.items():
            if name not in out:
                out[name] = JobHealth(
                    heard=0,
                    world_size=k.world_size,
                    heard_at=k.heard_at if math.isfinite(k.heard_at) else None,
                    credential_expires=k.credential_expires,
                )
        return out
