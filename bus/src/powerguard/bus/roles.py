"""Who may say what on the bus: the server-enforced permissions of every PowerGuard party.

Each party gets a NATS user whose JWT lists exactly the subjects it may publish and subscribe
(see ``docs/security.md``). Events are bound to subjects (:func:`powerguard.schemas.check_subject`),
so a publish permission on a subject is the right to say that kind of thing about that node,
job or site, and nothing else. No service is a JetStream admin: ``admin`` (``powerguard
bootstrap``) creates the stream, the KV buckets and the durable consumers; services use only
their own durable (info, next message, ack), their own KV buckets, and read-only lookups.
"""

from __future__ import annotations

from collections.abc import Iterable

from powerguard.schemas import token

from .jwt import Permissions
from .names import JS_DOMAIN, BusNames
from .pull import next_subject

ROLES = ("admin", "ups-monitor", "coordinator", "power-control", "observer", "operator", "agent")
SERVICES = ("ups-monitor", "coordinator", "power-control")  # the site's services: each dead-letters its input


# The largest message the server accepts from each party, enforced by the server on every
# connection (the user JWT's ``payload``): a larger one is refused at the sender, whose connection
# the server closes, before it is stored or queued for anyone. A training job's agent sends acks,
# heartbeats and registrations of a few hundred bytes; the operator a drill reading (a few hundred
# bytes) and read-only JetStream requests, the observer only those; ups-monitor power events and
# its state bucket. The coordinator and power-control keep the server's ``max_payload`` (1 MB):
# a saga record's part, a dead-letter copy of whatever they were sent.
AGENT_MAX_PAYLOAD = 16 * 1024
OPERATOR_MAX_PAYLOAD = 8 * 1024
ROLE_MAX_PAYLOAD = {
    "agent": AGENT_MAX_PAYLOAD,
    "operator": OPERATOR_MAX_PAYLOAD,
    "observer": OPERATOR_MAX_PAYLOAD,
    "ups-monitor": 64 * 1024,
}


def durable_names(site: str) -> dict[str, str]:
    """The durable consumers of one site's services. The coordinator has four: real power events
    on their own, so no volume of acks, results or drill readings ever queues in front of them;
    a drill's readings (the operator's) on their own; power-control's results (the events
    stream); and the jobs' acks and resumes (the jobs' stream: a flood there is the jobs' alone)."""
    s = token(site, what="site")
    return {
        "coordinator-power": f"coordinator-power-{s}",
        "coordinator-drill": f"coordinator-drill-{s}",
        "coordinator": f"coordinator-{s}",
        "coordinator-jobs": f"coordinator-jobs-{s}",
        "power-control": f"power-control-{s}",
    }


def durable_filters(names: BusNames, site: str) -> dict[str, list[str]]:
    """What each durable consumes (one definition for ``powerguard bootstrap`` and the services);
    each durable's filters lie in one stream (``BusNames.stream_of``)."""
    s = names.subjects
    d = durable_names(site)
    return {
        d["coordinator-power"]: [s.power_events(site)],
        d["coordinator-drill"]: [s.drill_power_events(site)],
        d["coordinator"]: [s.power_result("*"), s.job_result("*"), s.ups_result("*")],
        # and the ranks' registrations (events, once per rank start; a heartbeat only when the
        # registry refused its record): the coordinator's book of known jobs hears them
        d["coordinator-jobs"]: [s.ckpt_ack("*", "*"), s.job_resumed("*"), s.agent("*", "*")],
        d["power-control"]: [s.power_cmd("*"), s.job_cmd("*"), s.ups_cmd("*")],
    }


# The most inputs a coordinator consumer takes as one batch. A batch is what arrived while the
# last one was applied and stored (the consumer takes what the server says is pending, up to
# this): a quiet site gets batches of 1, a burst of 100,000 acks a few batches of up to this,
# each stored once (bench/scale.py). The server lets a durable hold 4x this unacknowledged.
INPUT_BATCH = 32768
POWER_BATCH = 256  # readings of a few hundred UPSes at most between two batches


def durable_batches(site: str) -> dict[str, int]:
    """The batch each durable is read in (its ``max_ack_pending`` follows): one definition for
    ``powerguard bootstrap`` and the services."""
    d = durable_names(site)
    return {
        d["coordinator-power"]: POWER_BATCH,
        d["coordinator-drill"]: POWER_BATCH,
        d["coordinator"]: INPUT_BATCH,
        d["coordinator-jobs"]: INPUT_BATCH,
    }


def max_payload(role: str) -> int:
    """The largest message the server accepts from a credential of ``role`` (-1: the server's
    own ``max_payload``), enforced by the server on every connection (:data:`ROLE_MAX_PAYLOAD`)."""
    return ROLE_MAX_PAYLOAD.get(role, -1)


def inbox(role: str, job: str | None = None) -> str:
    """The reply-subject prefix of a role: nobody else may subscribe to its replies (a job's
    ranks share theirs, on every node)."""
    return f"_INBOX.{role}" + (f".{token(job, what='job')}" if job else "")


def _api(*parts: str) -> str:
    return "$JS.API." + ".".join(parts)


def _kv_read(bucket: str, *, named: bool = True) -> list[str]:
    """Reads of a KV bucket (``named``: also consumers created by name, which may be durable)."""
    stream = f"KV_{bucket}"
    return [
        _api("STREAM.INFO", stream),
        _api("STREAM.MSG.GET", stream),
        _api("DIRECT.GET", stream),
        _api("DIRECT.GET", stream, ">"),
        # keys and watches: ordered consumers on the bucket's own stream
        _api("CONSUMER.CREATE", stream),
        *([_api("CONSUMER.CREATE", stream, ">")] if named else []),
        _api("CONSUMER.DELETE", stream, ">"),
        _api("CONSUMER.INFO", stream, ">"),
        f"$JS.FC.{stream}.>",
    ]


def _kv_write(bucket: str, keys: str = ">") -> list[str]:
    return [f"$KV.{bucket}.{keys}", *_kv_read(bucket)]


def _durable(stream: str, name: str) -> list[str]:
    return [
        _api("CONSUMER.INFO", stream, name),
        next_subject(stream, name),
        f"$JS.ACK.{stream}.{name}.>",
    ]


def permissions(
    role: str, names: BusNames, *, sites: Iterable[str] = (), job: str | None = None, node: str | None = None
) -> Permissions:
    """The permissions of ``role`` on a deployment (``sites``: the sites its services run;
    ``job``: the job of an ``agent``; ``node``: the one node it may register ranks on, which the
    server then confirms: without it, any node of the job's choosing)."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}")
    s, n, stream, jobs = names.subjects, names, names.stream, names.jobs_stream
    sites = [token(x, what="site") for x in sites]
    durables = {d: names.stream_of(f[0]) for site in sites for d, f in durable_filters(names, site).items()}
    if role == "admin":
        return Permissions(
            # snapshot acks and restore chunks: `powerguard backup` / `restore` (bus/backup.py)
            pub_allow=("$JS.API.>", "$KV.>", "$JS.ACK.>", "$JS.FC.>", "$JS.SNAPSHOT.>"),
            sub_allow=(f"{inbox(role)}.>",),
            inbox=inbox(role),
        )
    if role == "agent":
        if not job:
            raise ValueError("an agent credential is for one job: give --job")
        j = token(job, what="job")
        where = token(node, what="node") if node else "*"
        js = (
            f"$KV.{n.agents}.{j}.{where}.*",
            _api("STREAM.INFO", f"KV_{n.agents}"),
            _api("DIRECT.GET", stream, s.ckpt_request(j)),  # catch up after a reconnect
            _api("DIRECT.GET", stream, s.ckpt_release(j)),
            _api("DIRECT.GET", stream, s.ckpt_recorded(j)),  # a restore's floor, as an event (older releases)
            _api("DIRECT.GET", f"KV_{n.floors}", f"$KV.{n.floors}.{j}"),  # ... and in its own store: its own key
        )
        # the same operations through the site's JetStream domain: the ranks behind a compute
        # node's leaf nats-server reach them only so (the server maps them onto the ones above)
        in_domain = tuple(f"$JS.{JS_DOMAIN}.API.{x.removeprefix('$JS.API.')}" for x in js)
        return Permissions(
            pub_allow=(
                s.agent(j, "*"),
                s.ckpt_ack(j, "*"),
                s.job_resumed(j),
                s.ckpt_trigger(j),  # the HTTP trigger: a request for its own job only, on its own stream
                *js,
                *in_domain,
            ),
            sub_allow=(s.ckpt_request(j), s.ckpt_trigger(j), s.ckpt_release(j), f"{inbox(role, j)}.>"),
            inbox=inbox(role, j),
        )
    if node:
        raise ValueError("only an agent credential is for one node")
    common_sub = (f"{inbox(role)}.>",)
    if role == "ups-monitor":
        pub = [*(s.power_events(site) for site in sites), s.dlq(role), *_kv_write(n.ups)]
        return Permissions(pub_allow=tuple(pub), sub_allow=common_sub, inbox=inbox(role))
    if role == "coordinator":
        pub = [
            s.commands,
            s.ckpt_request("*"),
            s.ckpt_release("*"),
            s.ckpt_recorded("*"),
            s.saga("*"),
            s.dlq(role),
            _api("STREAM.INFO", stream),
            _api("STREAM.INFO", jobs),
            *_kv_write(n.sagas),
            *_kv_write(n.status),
            *_kv_write(n.leases),
            f"$KV.{n.floors}.*",  # each job's restore floor: written, never read back or watched
            _api("STREAM.INFO", f"KV_{n.floors}"),
            *_kv_read(n.agents),
            # the agent registry's bucket, should the server lose it (memory-stored: a single
            # server forgets it on restart); that stream only, never another's (Bus.ensure_agents)
            _api("STREAM.CREATE", f"KV_{n.agents}"),
        ]
        for site in sites:
            for d in ("coordinator-power", "coordinator-drill", "coordinator", "coordinator-jobs"):
                name = durable_names(site)[d]
                pub += _durable(durables[name], name)
            # a UPS's newest reading when its events queue up: the current state, not the backlog
            pub += [
                _api("DIRECT.GET", stream, s.power_events(site)),
                _api("DIRECT.GET", stream, s.drill_power_events(site)),
            ]
        return Permissions(pub_allow=tuple(pub), sub_allow=common_sub, inbox=inbox(role))
    if role == "power-control":
        # a saga's state only as the coordinator announced it (its newest pg.saga.<id> event),
        # never the coordinator's records
        pub = [s.results, s.dlq(role), _api("STREAM.INFO", stream), *_kv_write(n.power)]
        pub += [_api("DIRECT.GET", stream, s.saga("*"))]
        for site in sites:
            pub += _durable(stream, durable_names(site)["power-control"])
        # the announcements live too: an outage's start and end for the scheduler adapter (saga_edges.py)
        return Permissions(pub_allow=tuple(pub), sub_allow=(*common_sub, s.saga("*")), inbox=inbox(role))
    # observer: reads everything, publishes no event, cannot touch any service's consumer;
    # operator (`powerguard drill`, `status`, `tail`): the same, and may publish a site's drill
    # power events (never a real one: a drill's subject is its own, so nothing it says is real).
    # Consumers only through the create endpoint without a name in its subject, which the server
    # refuses for a durable ("consumer expected to be ephemeral"): ephemeral pull and ordered
    # consumers, nothing that outlives the connection. It subscribes to its own inbox only, so
    # what it reads arrives there (a push consumer delivering anywhere else finds none of its
    # interest; the server does not check a push consumer's deliver subject: docs/security.md)
    deny = [
        _api("CONSUMER.DURABLE.CREATE", ">"),
        "$JS.ACK.>",
        _api("STREAM.CREATE", ">"),
        _api("STREAM.UPDATE", ">"),
        _api("STREAM.DELETE", ">"),
        _api("STREAM.PURGE", ">"),
    ]
    for d, in_stream in sorted(durables.items()):
        deny += [next_subject(in_stream, d), _api("CONSUMER.DELETE", in_stream, d)]
    pub = [
        *(
            x
            for st in (stream, jobs)
            for x in (
                _api("STREAM.INFO", st),
                _api("STREAM.MSG.GET", st),
                _api("DIRECT.GET", st),
                _api("DIRECT.GET", st, ">"),
                _api("CONSUMER.CREATE", st),
                next_subject(st, "*"),
                _api("CONSUMER.DELETE", st, "*"),
                _api("CONSUMER.INFO", st, "*"),
            )
        ),
        # the sagas as the coordinator publishes them; never its records (pg_sagas: its own storage)
        *_kv_read(n.status, named=False),
        *_kv_read(n.agents, named=False),
        # the other buckets' existence and size for the health exporter: stream info only, never a
        # value (pg_sagas is the coordinator's storage, pg_ups holds the event-id secret, pg_power
        # the ledger, pg_leases the leader)
        *(_api("STREAM.INFO", f"KV_{b}") for b in (n.sagas, n.leases, n.ups, n.power, n.floors)),
    ]
    if role == "operator":
        pub += [s.drill_power_events(site) for site in sites]
    return Permissions(pub_allow=tuple(pub), pub_deny=tuple(deny), sub_allow=common_sub, inbox=inbox(role))
