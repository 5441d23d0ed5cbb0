"""Who powers what: UPS feeds of nodes (site YAML) and the ranks of jobs (agent registry)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from powerguard.schemas import AgentData, HoldPolicy, ShutdownTimings, SiteConfig


@dataclass(frozen=True)
class Topology:
    site: str
    feeds: Mapping[str, tuple[str, ...]]  # compute node -> UPSes feeding it
    capacity: Mapping[str, tuple[float, float]] = field(default_factory=dict)  # UPS -> (Wh, rated W)
    # storage, network and management nodes -> (role, feeds): never part of the outage's shutdown,
    # only of the last stage of an outage longer than the battery (killpower.py)
    infra: Mapping[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)
    # compute node -> the longest its shutdown takes while its devices answer (the site file's
    # power_control timings: ShutdownTimings.bound_s); a node without one: not known
    bounds: Mapping[str, float] = field(default_factory=dict)
    groups: Mapping[tuple[str, ...], tuple[str, ...]] = field(init=False)  # feed set -> its nodes

    def __post_init__(self) -> None:
        groups: dict[tuple[str, ...], list[str]] = {}
        for node, feeds in sorted(self.feeds.items()):
            groups.setdefault(tuple(sorted(set(feeds))), []).append(node)
        object.__setattr__(self, "groups", {k: tuple(v) for k, v in groups.items()})

    @classmethod
    def from_site(cls, site: SiteConfig) -> Topology:
        capacity = {u.name: (u.capacity_wh, u.rated_w) for u in site.ups if u.capacity_wh and u.rated_w}
        feeds = {n.name: tuple(n.feeds) for n in site.nodes if n.role == "compute"}
        infra = {n.name: (n.role, tuple(n.feeds)) for n in site.nodes if n.role != "compute"}
        timings = site.settings("power_control", ShutdownTimings)
        bounds = {n.name: timings.bound_s(n) for n in site.nodes if n.role == "compute"}
        return cls(site=site.site, feeds=feeds, capacity=capacity, infra=infra, bounds=bounds)

    def group_bound_s(self, group: str) -> float | None:
        """The longest shutdown of a node group (``A+B``) by the site's own timings, or None."""
        known = [self.bounds[n] for n in self.groups.get(tuple(group.split("+")), ()) if n in self.bounds]
        return max(known) if known else None

    @property
    def ups(self) -> set[str]:
        return {u for feeds in self.feeds.values() for u in feeds} | {
            u for _, feeds in self.infra.values() for u in feeds
        }

    def nodes_at_risk(self, on_battery: Iterable[str]) -> list[str]:
        """Nodes whose every feed is on battery (A+B: one healthy feed keeps a node safe)."""
        down = set(on_battery)
        return sorted(n for feeds, nodes in self.groups.items() if feeds and set(feeds) <= down for n in nodes)

    @staticmethod
    def group_key(feeds: Iterable[str]) -> str:
        """A node group's name: its feed set (``A+B``), the unit shutdown times are measured in."""
        return "+".join(sorted(set(feeds)))

    def feed_sets_at_risk(self, on_battery: Iterable[str]) -> list[tuple[str, ...]]:
        down = set(on_battery)
        return [feeds for feeds in self.groups if feeds and set(feeds) <= down]


@dataclass
class JobInfo:
    job: str
    world_size: int
    ranks: dict[int, str] = field(default_factory=dict)  # rank -> node
    step: int | None = None  # newest step any rank reported
    hold_policy: HoldPolicy | None = None  # from the job's registration (None: the site's default)
    # when a rank of the job was last heard from (a registration or heartbeat as it happened);
    # -inf: only known from the bucket's stored records (a coordinator that just started: the
    # ranks may have died with the power); None: the caller does not track it (counts as heard)
    heard_at: float | None = None

    @property
    def nodes(self) -> set[str]:
        return set(self.ranks.values())


@dataclass(frozen=True)
class JobHealth:
    heard: int  # ranks heard within the registry's TTL
    world_size: int
    heard_at: float | None  # when a rank was last heard as it happened (None: only stored records)
    credential_expires: float | None  # the soonest any rank's credential expires


class AgentRegistry:
    """Jobs and ranks learned from agent registrations and heartbeats (the ``pg_agents`` KV).

    An agent not seen for ``ttl_s`` no longer counts (the bucket's TTL drops it silently).
    Stored per job, so :meth:`jobs` (called when an outage starts, at 100,000 ranks) is a few
    dictionary comprehensions, not a loop of Python statements per rank."""

    def __init__(self, ttl_s: float = 30.0) -> None:
        self.ttl_s = ttl_s
        self._by_job: dict[str, dict[int, tuple[AgentData, float]]] = {}
        self._heard: dict[str, float] = {}  # job -> when a rank of it was last heard as it happened
        # jobs whose last rank deregistered (its key deleted): they ended. A job merely absent
        # (a registry lost with a whole-site power cut, or silent past the TTL) is not in here
        self._ended: set[str] = set()

    def update(self, agent: AgentData, seen_at: float = float("inf"), *, heard: bool = True) -> None:
        """A rank's record; ``heard``: it came as it happened (a registration or heartbeat), not
        from the bucket's stored records read at start."""
        self._by_job.setdefault(agent.job, {})[agent.rank] = (agent, seen_at)
        self._ended.discard(agent.job)
        if heard:
            self._heard[agent.job] = max(self._heard.get(agent.job, -math.inf), seen_at)

    def remove(self, job: str, rank: int) -> None:
        ranks = self._by_job.get(job)
        if ranks is not None:
            ranks.pop(rank, None)
            if not ranks:
                del self._by_job[job]
                self._heard.pop(job, None)
                self._ended.add(job)

    def ended(self) -> set[str]:
        """Jobs whose every rank deregistered since this registry started (they ended)."""
        return set(self._ended)

    def remove_key(self, key: str) -> None:
        """A ``<job>.<node>.<rank>`` key was deleted: the rank goes, if it was on that node."""
        parts = key.split(".")
        if len(parts) != 3 or not parts[2].isdigit():
            return
        job, node, rank = parts[0], parts[1], int(parts[2])
        entry = self._by_job.get(job, {}).get(rank)
        if entry is not None and entry[0].node == node:
            self.remove(job, rank)

    def agents(self, job: str) -> list[AgentData]:
        """The ranks of ``job`` as last registered or heard from (any age)."""
        return [a for a, _ in self._by_job.get(job, {}).values()]

    def __len__(self) -> int:
        return sum(len(ranks) for ranks in self._by_job.values())

    def health(self, now: float) -> dict[str, JobHealth]:
        """Every job with a record, live or silent: how many of its ranks were heard within the
        TTL of how many it has, when it was last heard and when its credential expires first (what
        the exporter shows; a job whose ranks all fell off the bus stays here with 0 heard until
        it deregisters)."""
        out = {}
        cutoff = now - self.ttl_s
        for job, ranks in self._by_job.items():
            records = [a for a, _ in ranks.values()]
            zero = ranks.get(0)
            world = zero[0].world_size if zero is not None else max(a.world_size for a in records)
            expiries = [a.credential_expires for a in records if a.credential_expires is not None]
            out[job] = JobHealth(
                heard=sum(1 for r, (_, seen) in ranks.items() if seen >= cutoff and r < world),
                world_size=world,
                heard_at=self._heard.get(job),
                credential_expires=min(expiries) if expiries else None,
            )
        return out

    def jobs(self, now: float | None = None) -> dict[str, JobInfo]:
        out: dict[str, JobInfo] = {}
        cutoff = -math.inf if now is None else now - self.ttl_s
        for job, all_ranks in self._by_job.items():
            live = {r: a for r, (a, seen) in all_ranks.items() if seen >= cutoff}
            if not live:
                continue
            # job-wide fields come from one place the job owns, its rank 0 (any rank's word for the
            # world size or the hold policy would let one rank change them for all); until rank 0
            # is known, the world size the most ranks agree on and the site's hold policy
            if 0 in live:
                world, hold = live[0].world_size, live[0].hold_policy
            else:
                sizes = [a.world_size for a in live.values()]
                world, hold = max(set(sizes), key=lambda n: (sizes.count(n), -n)), None
            live = {r: a for r, a in live.items() if r < world and a.world_size == world}
            if not live:
                continue
            steps = [a.step for a in live.values() if a.step is not None]
            out[job] = JobInfo(
                job=job,
                world_size=world,
                ranks={r: a.node for r, a in live.items()},
                step=max(steps) if steps else None,
                hold_policy=hold,
                heard_at=self._heard.get(job, -math.inf),
            )
        return out
