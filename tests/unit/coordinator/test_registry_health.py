"""What the coordinator exports of each job's ranks (``AgentRegistry.health``): a job whose ranks
fell off the bus stays, with 0 of them heard, until it deregisters; its credential's expiry is
the soonest any rank reported."""

from __future__ import annotations

from powerguard.coordinator.topology import AgentRegistry
from powerguard.schemas import AgentData


def rank(r: int, *, job: str = "jobA", expires: float | None = None) -> AgentData:
    return AgentData(job=job, rank=r, world_size=4, node=f"n{r // 2}", credential_expires=expires)


def test_a_job_whose_ranks_went_silent_is_still_there_with_none_heard():
    reg = AgentRegistry(ttl_s=30)
    for r in range(4):
        reg.update(rank(r, expires=1000.0 + r), seen_at=100.0)
    h = reg.health(now=110.0)["jobA"]
    assert (h.heard, h.world_size, h.heard_at, h.credential_expires) == (4, 4, 100.0, 1000.0)
    later = reg.health(now=200.0)["jobA"]  # nothing heard for 100 s: revoked, expired, or off the bus
    assert (later.heard, later.world_size) == (0, 4)
    assert "jobA" not in reg.jobs(now=200.0)  # an outage would not count on them
    for r in range(4):
        reg.remove("jobA", r)  # deregistered (finished): gone from the export too
    assert reg.health(now=200.0) == {}


def test_stored_records_are_not_news_and_a_job_without_expiry_has_none():
    reg = AgentRegistry(ttl_s=30)
    reg.update(rank(0), seen_at=50.0, heard=False)  # read from the bucket at start
    h = reg.health(now=60.0)["jobA"]
    assert h.heard == 1 and h.heard_at is None and h.credential_expires is None
