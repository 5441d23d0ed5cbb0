"""NATS subjects of the event contract, built in exactly one place.

Services never format subjects themselves; they call :class:`Subjects`.

Layout (prefix ``pg`` by default). Each tree has one publisher, so the server's subject
permissions say who may say what; jobs are a token of every agent subject, so a job's
credential can be scoped to its own job. What training jobs' agents say (acks, resumes,
triggers, registrations) lives in its own stream (``job_trees``); what the site's services say,
the requests and releases to jobs included, in the events stream (``event_trees``). No subject
of the events stream is writable by an agent::

    pg.power.<site>.<ups>        power events and telemetry         ups-monitor
    pg.cmd.power.<node>          power commands                     coordinator
    pg.cmd.job.<job>             job stop / restart commands        coordinator
    pg.result.power.<node>       power results and node state       power-control
    pg.result.job.<job>          job stopped / restarted            power-control
    pg.cmd.ups.<ups>             a UPS's output off and return      coordinator
    pg.result.ups.<ups>          what the UPS did                   power-control
    pg.ckpt.<job>.request        checkpoint requests                coordinator
    pg.ckpt.<job>.release        paused ranks may train on          coordinator
    pg.ckpt.<job>.recorded       the step every rank acked durable  coordinator
    pg.ckpt.<job>.trigger        a checkpoint asked over HTTP       the job's own agents
    pg.ckpt.<job>.<rank>.ack     checkpoint acks (durable / failed) the job's agents
    pg.ckpt.<job>.resumed        the job trains again               the job's agents
    pg.agent.<job>.<rank>        registration and heartbeats        the job's agents
    pg.saga.<saga_id>            saga state changes                 coordinator
    pg.dlq.<service>             rejected input                     each service, its own

An event is valid only on the subject its own data names (:func:`check_subject`): a consumer
dead-letters a ``ShutdownRequested`` that arrives on an agent subject, or an ack for job A
published on job B's subject.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import InvalidSubjectToken

_TOKEN = re.compile(r"^[A-Za-z0-9_-]{1,128}$")


def token(value: object, *, what: str = "name") -> str:
    """Return ``value`` as a subject token, or raise :class:`InvalidSubjectToken`."""
    text = str(value)
    if not _TOKEN.match(text):
        raise InvalidSubjectToken(
            f"{what} {text!r} cannot be used in a NATS subject: use 1-128 characters from A-Z a-z 0-9 _ -"
        )
    return text


def site_token(value: object) -> str:
    return token(value, what="site")


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

    def drill_power(self, site: str, ups: str) -> str:
        """A drill's synthetic power event (``powerguard drill``): only the operator may publish
        here, and a saga started from it is dry-run whatever else happens."""
        return f"{self.prefix}.drill.power.{site_token(site)}.{token(ups, what='ups')}"

    def drill_power_events(self, site: str = "*") -> str:
        site_part = "*" if site == "*" else site_token(site)
        return f"{self.prefix}.drill.power.{site_part}.*"

    # agents & checkpoints -------------------------------------------------
    def agent(self, job: str, rank: int | str) -> str:
        return f"{self.prefix}.agent.{_job_or_star(job)}.{_rank(rank)}"

    def ckpt_request(self, job: str) -> str:
        return f"{self.prefix}.ckpt.{_job_or_star(job)}.request"

    def ckpt_release(self, job: str) -> str:
        return f"{self.prefix}.ckpt.{_job_or_star(job)}.release"

    def ckpt_recorded(self, job: str) -> str:
        return f"{self.prefix}.ckpt.{_job_or_star(job)}.recorded"

    def ckpt_ack(self, job: str, rank: int | str) -> str:
        return f"{self.prefix}.ckpt.{_job_or_star(job)}.{_rank(rank)}.ack"

    def ckpt_trigger(self, job: str) -> str:
        return f"{self.prefix}.ckpt.{_job_or_star(job)}.trigger"

    def job_resumed(self, job: str) -> str:
        return f"{self.prefix}.ckpt.{_job_or_star(job)}.resumed"

    # saga, commands, results ----------------------------------------------
    def saga(self, saga_id: str) -> str:
        return f"{self.prefix}.saga.{_star_or(saga_id, 'saga id')}"

    def power_cmd(self, node: str) -> str:
        return f"{self.prefix}.cmd.power.{_star_or(node, 'node')}"

    def job_cmd(self, job: str) -> str:
        return f"{self.prefix}.cmd.job.{_job_or_star(job)}"

    def power_result(self, node: str) -> str:
        return f"{self.prefix}.result.power.{_star_or(node, 'node')}"

    def job_result(self, job: str) -> str:
        return f"{self.prefix}.result.job.{_job_or_star(job)}"

    def ups_cmd(self, ups: str) -> str:
        return f"{self.prefix}.cmd.ups.{_star_or(ups, 'ups')}"

    def ups_result(self, ups: str) -> str:
        return f"{self.prefix}.result.ups.{_star_or(ups, 'ups')}"

    @property
    def commands(self) -> str:
        return f"{self.prefix}.cmd.>"

    @property
    def results(self) -> str:
        return f"{self.prefix}.result.>"

    def dlq(self, service: str) -> str:
        return f"{self.prefix}.dlq.{_star_or(service, 'service')}"

    # whole contract --------------------------------------------------------
    @property
    def all(self) -> str:
        return f"{self.prefix}.>"

    # the two streams -------------------------------------------------------
    @property
    def job_trees(self) -> list[str]:
        """What the training jobs' stream stores: what their agents write."""
        p = self.prefix
        return [f"{p}.agent.>", f"{p}.ckpt.*.*.ack", f"{p}.ckpt.*.resumed", f"{p}.ckpt.*.trigger"]

    @property
    def event_trees(self) -> list[str]:
        """What the events stream stores: what the site's services write."""
        p = self.prefix
        return [
            *(f"{p}.{t}.>" for t in ("power", "drill", "cmd", "result", "saga", "dlq")),
            f"{p}.ckpt.*.request",
            f"{p}.ckpt.*.release",
            f"{p}.ckpt.*.recorded",
        ]


def intersect(a: str, b: str) -> str | None:
    """The subjects two NATS subject filters both match, as one filter (None: none)."""
    ta, tb = a.split("."), b.split(".")
    out: list[str] = []
    for i in range(max(len(ta), len(tb))):
        x = ta[i] if i < len(ta) else None
        y = tb[i] if i < len(tb) else None
        if x == ">":
            return ".".join(out + tb[i:]) if y is not None else None
        if y == ">":
            return ".".join(out + ta[i:]) if x is not None else None
        if x is None or y is None:
            return None
        if x == "*":
            out.append(y)
        elif y == "*" or x == y:
            out.append(x)
        else:
            return None
    return ".".join(out)


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
