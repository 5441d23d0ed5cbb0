"""Names of the stream, KV buckets and subject prefix one deployment uses."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from powerguard.schemas.site import NatsSettings
from powerguard.schemas.subjects import Subjects

# The JetStream domain of the site's servers when compute nodes run leaf nats-servers
# (compose/nats-leafnodes.conf): a client behind a leaf reaches the site's JetStream and KV as
# ``$JS.powerguard.API.>``, which the site server maps to its own API (NATS forbids the plain
# ``$JS.API.>`` and ``$KV.>`` across a leaf connection of a non-system account).
JS_DOMAIN = "powerguard"


@dataclass(frozen=True)
class BusNames:
    prefix: str = "pg"
    stream: str = "PG_EVENTS"
    sagas: str = "pg_sagas"
    agents: str = "pg_agents"
    leases: str = "pg_leases"
    ups: str = "pg_ups"
    power: str = "pg_power"
    subjects: Subjects = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "subjects", Subjects(self.prefix))

    @staticmethod
    def saga_key(saga_id: str) -> str:
        """Key of a saga's record in the sagas bucket."""
        return f"saga.{saga_id}"

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
            agents=nats.agents_bucket,
            leases=nats.leases_bucket,
            ups=nats.ups_bucket,
            power=nats.power_bucket,
        )

    @classmethod
    def isolated(cls, tag: str | None = None) -> BusNames:
        """Names no other user of the same server shares (tests, drills)."""
        t = tag or uuid.uuid4().hex[:10]
        return cls(
            prefix=f"t{t}",
            stream=f"PG_EVENTS_{t}",
            sagas=f"pg_sagas_{t}",
            agents=f"pg_agents_{t}",
            leases=f"pg_leases_{t}",
            ups=f"pg_ups_{t}",
            power=f"pg_power_{t}",
        )


@dataclass(frozen=True)
class StreamLimits:
    max_age_s: float = 7 * 24 * 3600
    max_bytes: int = 1024 * 1024 * 1024
    duplicate_window_s: float = 120.0
    replicas: int = 1
    agents_ttl_s: float = 30.0
    leases_ttl_s: float = 10.0
    sagas_history: int = 10
    power_ttl_s: float = 7 * 24 * 3600
