"""NATS subjects of the event contract, built in exactly one place.

Services never format subjects themselves; they call :class:`Subjects`.

Layout (prefix ``pg`` by default)::

    pg.power.<site>.<ups>        power events and telemetry
    pg.power.cmd.<node>          power commands (coordinator -> power-control)
    pg.power.result.<node>       power results (power-control -> everyone)
    pg.agent.<job>.<rank>        agent registration and heartbeats
    pg.ckpt.<job>.request        checkpoint requests
    pg.ckpt.<job>.<rank>.ack     checkpoint acks (durable / failed)
    pg.ckpt.<job>.release        paused ranks may train on
    pg.saga.<saga_id>            saga state changes
    pg.job.<job>                 job stop/restart/resumed
    pg.dlq.<service>             rejected input

Because power events and power commands share ``pg.power.``, the site names
``cmd`` and ``result`` are reserved and refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import InvalidSubjectToken

_TOKEN = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
RESERVED_SITES = frozenset({"cmd", "result"})


def token(value: object, *, what: str = "name") -> str:
    """Return ``value`` as a subject token, or raise :class:`InvalidSubjectToken`."""
    text = str(value)
    if not _TOKEN.match(text):
        raise InvalidSubjectToken(
            f"{what} {text!r} cannot be used in a NATS subject: use 1-128 characters from A-Z a-z 0-9 _ -"
        )
    return text


def site_token(value: object) -> str:
    text = token(value, what="site")
    if text in RESERVED_SITES:
        raise InvalidSubjectToken(f"site name {text!r} is reserved (it collides with power commands)")
    return text


@dataclass(frozen=True)
class Subjects:
    """Subject builder for one prefix."""

    prefix: str = "pg"

    def __post_init__(self) -> None:
        for part in self.prefix.split("."):
            token(part, what="subject prefix")

    # power events ---------------------------------------------------------
    def power(self, site: str, ups: str) -> str:
        return f"{self.prefix}.power.{site_token(site)}.{token(ups, what='ups')}"

    def power_events(self, site: str = "*") -> str:
        """Wildcard for every UPS of one site (or, with ``*``, all sites)."""
        site_part = "*" if site == "*" else site_token(site)
        return f"{self.prefix}.power.{site_part}.*"

    # agents & checkpoints -------------------------------------------------
    def agent(self, job: str, rank: int | str) -> str:
        return f"{self.prefix}.agent.{token(job, what='job')}.{_rank(rank)}"

    def ckpt_request(self, job: str) -> str:
        return f"{self.prefix}.ckpt.{_job_or_star(job)}.request"

    def ckpt_release(self, job: str) -> str:
        return f"{self.prefix}.ckpt.{_job_or_star(job)}.release"

    def ckpt_ack(self, job: str, rank: int | str) -> str:
        return f"{self.prefix}.ckpt.{_job_or_star(job)}.{_rank(rank)}.ack"

    # saga, power commands, jobs ------------------------------------------
    def saga(self, saga_id: str) -> str:
        return f"{self.prefix}.saga.{_star_or(saga_id, 'saga id')}"

    def power_cmd(self, node: str) -> str:
        return f"{self.prefix}.power.cmd.{_star_or(node, 'node')}"

    def power_result(self, node: str) -> str:
        return f"{self.prefix}.power.result.{_star_or(node, 'node')}"

    def job(self, job: str) -> str:
        return f"{self.prefix}.job.{_job_or_star(job)}"

    def dlq(self, service: str) -> str:
        return f"{self.prefix}.dlq.{_star_or(service, 'service')}"

    # whole contract --------------------------------------------------------
    @property
    def all(self) -> str:
        return f"{self.prefix}.>"


def _rank(rank: int | str) -> str:
    if rank == "*":
        return "*"
    if isinstance(rank, bool) or not str(rank).isdigit():
        raise InvalidSubjectToken(f"rank {rank!r} must be a non-negative integer")
    return str(int(rank))


def _star_or(value: str, what: str) -> str:
    return "*" if value == "*" else token(value, what=what)


def _job_or_star(job: str) -> str:
    return _star_or(job, "job")
