"""Names of the stream, KV buckets and subject prefix one deployment uses."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from powerguard.schemas.site import NatsSettings
from powerguard.schemas.subjects import Subjects, intersect

# The JetStream domain of the site's servers when compute nodes run leaf nats-servers
# (compose/nats-leafnodes.conf): a client behind a leaf reaches the site's JetStream and KV as
# ``$JS.powerguard.API.>``, which the site server maps to its own API (NATS forbids the plain
# ``$JS.API.>`` and ``$KV.>`` across a leaf connection of a non-system account).
JS_DOMAIN = "powerguard"


@dataclass(frozen=True)
class BusNames:
    """The names of one deployment. Two streams: ``stream`` holds what the site's services say
    (power events, commands, results, saga states, dead letters) and ``jobs_stream`` what the
    training jobs' agents say (acks, registrations, resumes, and the requests and releases sent
    to them). Each stream has its own write path in the server: no job's traffic, however much,
    queues in front of a power event (docs/security.md, "What is isolated from what")."""

    prefix: str = "pg"
    stream: str = "PG_EVENTS"
    sagas: str = "pg_sagas"
    status: str = "pg_status"  # the published status of each saga (schemas/status.py), for tools
    agents: str = "pg_agents"
    leases: str = "pg_leases"
    ups: str = "pg_ups"
    power: str = "pg_power"
    # each job's restore floor (the step every rank acked durable): the coordinator writes, the
    # job's agents read their own key; no age limit, never discarded for room (docs/security.md)
    floors: str = "pg_floors"
    jobs_stream: str = ""  # default: the events stream's name with JOBS for EVENTS (PG_JOBS)
    subjects: Subjects = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "subjects", Subjects(self.prefix))
        if not self.jobs_stream:
            jobs = self.stream.replace("EVENTS", "JOBS") if "EVENTS" in self.stream else f"{self.stream}_JOBS"
            object.__setattr__(self, "jobs_stream", jobs)

    @property
    def streams(self) -> tuple[str, str]:
        return (self.stream, self.jobs_stream)

    def stream_of(self, subject: str) -> str:
        """The stream that stores ``subject`` (one that both hold, like ``pg.>``, is an error:
        :meth:`split`)."""
        parts = self.split([subject])
        if len(parts) != 1:
            raise ValueError(f"{subject} spans both streams ({', '.join(parts)}): split it")
        return next(iter(parts))

    def split(self, subjects: list[str]) -> dict[str, list[str]]:
        """Subject filters by the stream that stores what they match; a filter that matches in
        both (``pg.>``, ``pg.ckpt.>``) becomes its part in each."""
        s = self.subjects
        out: dict[str, list[str]] = {}
        for subject in subjects:
            for stream, trees in ((self.stream, s.event_trees), (self.jobs_stream, s.job_trees)):
                parts = [x for t in trees if (x := intersect(subject, t)) is not None]
                if parts:
                    out.setdefault(stream, []).extend(parts)
        return {k: list(dict.fromkeys(v)) for k, v in out.items()}

    @staticmethod
    def saga_key(saga_id: str) -> str:
        """Key of a saga's record in the sagas bucket."""
        return f"saga.{saga_id}"

    @staticmethod
    def status_key(saga_id: str) -> str:
        """Key of a saga's published status in the status bucket."""
        return f"saga.{saga_id}"

    @staticmethod
    def site_status_key(site: str) -> str:
        """Key of a site's published status in the status bucket."""
        return f"site.{site}"

    @staticmethod
    def saga_part_key(saga_id: str, name_hash: str, generation: str) -> str:
        """Key of one part of a large saga record (written before the head that refers to it)."""
        return f"sagapart.{saga_id}.{name_hash}.{generation}"

    @staticmethod
    def saga_parts_prefix(saga_id: str) -> str:
        return f"sagapart.{saga_id}."

    @classmethod
    def from_settings(cls, nats: NatsSettings) -> BusNames:
        return cls(
            prefix=nats.prefix,
            stream=nats.stream,
            sagas=nats.sagas_bucket,
            status=nats.status_bucket,
            agents=nats.agents_bucket,
            leases=nats.leases_bucket,
            ups=nats.ups_bucket,
            power=nats.power_bucket,
            floors=nats.floors_bucket,
            jobs_stream=nats.jobs_stream or "",
        )

    @classmethod
    def isolated(cls, tag: str | None = None) -> BusNames:
        """Names no other user of the same server shares (tests, drills)."""
        t = tag or uuid.uuid4().hex[:10]
        return cls(
            prefix=f"t{t}",
            stream=f"PG_EVENTS_{t}",
            sagas=f"pg_sagas_{t}",
            status=f"pg_status_{t}",
            agents=f"pg_agents_{t}",
            leases=f"pg_leases_{t}",
            ups=f"pg_ups_{t}",
            power=f"pg_power_{t}",
            floors=f"pg_floors_{t}",
            jobs_stream=f"PG_JOBS_{t}",
        )


@dataclass(frozen=True)
class StreamLimits:
    max_age_s: float = 7 * 24 * 3600
    max_bytes: int = 1024 * 1024 * 1024
    duplicate_window_s: float = 120.0
    # the jobs' stream: what the least trusted parties write is bounded by the server. A subject
    # (one rank's acks or heartbeats, one job's resumes) takes at most this many messages within
    # the stream's age; the server refuses more at once, before storing them (discard new, per
    # subject), so a job flooding its own subject is refused at the cost of a lookup, not of a
    # write. None larger than an agent may send, none older than an hour (heartbeats every 5 s:
    # 720 a rank an hour)
    jobs_max_msgs_per_subject: int = 10_000
    jobs_max_age_s: float = 3600.0
    jobs_max_bytes: int = 256 * 1024 * 1024
    jobs_max_msg_size: int = 16 * 1024
    replicas: int = 1
    agents_ttl_s: float = 30.0
    # the agent registry lives in the servers' memory (each replica a copy): a record is ~0.5 KB,
    # 100,000 ranks ~50 MB; a job writing keys without end is refused at this bound, not at the
    # servers' memory (bus/agents.py)
    agents_max_bytes: int = 256 * 1024 * 1024
    leases_ttl_s: float = 10.0
    sagas_history: int = 10
    power_ttl_s: float = 7 * 24 * 3600
