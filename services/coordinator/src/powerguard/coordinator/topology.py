"""Who powers what: UPS feeds of nodes (site YAML) and the ranks of jobs (agent registry)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from powerguard.schemas import AgentData, SiteConfig


@dataclass(frozen=True)
class Topology:
    site: str
    feeds: Mapping[str, tuple[str, ...]]  # node -> UPSes feeding it

    @classmethod
    def from_site(cls, site: SiteConfig) -> Topology:
        return cls(site=site.site, feeds={n.name: tuple(n.feeds) for n in site.nodes})

    @property
    def ups(self) -> set[str]:
        return {u for feeds in self.feeds.values() for u in feeds}

    def nodes_at_risk(self, on_battery: Iterable[str]) -> list[str]:
        """Nodes whose every feed is on battery (A+B: one healthy feed keeps a node safe)."""
        down = set(on_battery)
        return sorted(n for n, feeds in self.feeds.items() if feeds and all(f in down for f in feeds))


@dataclass
class JobInfo:
    job: str
    world_size: int
    ranks: dict[int, str] = field(default_factory=dict)  # rank -> node
    step: int | None = None  # newest step any rank reported

    @property
    def nodes(self) -> set[str]:
        return set(self.ranks.values())


class AgentRegistry:
    """Jobs and ranks learned from agent registrations and heartbeats."""

    def __init__(self) -> None:
        self._agents: dict[tuple[str, int], AgentData] = {}

    def update(self, agent: AgentData) -> None:
        self._agents[(agent.job, agent.rank)] = agent

    def remove(self, job: str, rank: int) -> None:
        self._agents.pop((job, rank), None)

    def __len__(self) -> int:
        return len(self._agents)

    def jobs(self) -> dict[str, JobInfo]:
        out: dict[str, JobInfo] = {}
        for (job, rank), a in self._agents.items():
            info = out.setdefault(job, JobInfo(job=job, world_size=a.world_size))
            info.world_size = max(info.world_size, a.world_size)
            info.ranks[rank] = a.node
            if a.step is not None:
                info.step = max(info.step or 0, a.step)
        return out

    def jobs_on(self, nodes: Iterable[str]) -> dict[str, JobInfo]:
        wanted = set(nodes)
        return {j: info for j, info in self.jobs().items() if info.nodes & wanted}
