"""The typed NATS JetStream client every PowerGuard service and outside tool uses."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client as NatsClient
from nats.js import api
from nats.js import errors as js_errors
from opentelemetry.trace import SpanKind, Status, StatusCode, TracerProvider

from powerguard.schemas import DEFAULT_MAX_PAYLOAD, DeadLetter, DeadLetterData, Envelope, EventError, encode

from . import metrics
from .consumer import (
    MAX_CLOCK_SKEW_S,
    BatchConsumer,
    BatchHandler,
    Consumer,
    Handler,
    Listener,
    Merged,
    Received,
    Subscription,
    decode_on,
    durable_config,
    filter_subjects,
)
from .errors import ConnectError, PublishError, ReadError, SetupError
from .kv import Kv
from .names import BusNames, StreamLimits
from .tracing import inject_headers, messaging_attributes, tracer

log = logging.getLogger(__name__)
SETUP_PATIENCE_S = 60.0  # how long a service's start waits for servers that do not answer its setup in time
PUBLISH_ATTEMPT_S = 5.0  # the longest one publish attempt waits for its ack before it is sent again


class _SslEofNotice(logging.Filter):
    """asyncio warns "returning true from eof_received() has no effect when using ssl" each time a
    TLS connection to the server closes (nats-py's protocol keeps the stream open on EOF, which
    asyncio ignores for TLS): nothing is wrong, and it buried every TLS command's output."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "eof_received() has no effect when using ssl" not in record.getMessage()


logging.getLogger("asyncio").addFilter(_SslEofNotice())


def redact(url: str) -> str:
    """A URL fit for a log: ``nats://user:secret@host`` becomes ``nats://user:***@host``."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    cred, _, host = rest.rpartition("@")
    user = cred.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}" if ":" in cred else f"{scheme}://***@{host}"


async def _first_connection(connecting, refused: asyncio.Event, timeout: float):
    """nats.py's connect, given up at ``timeout`` or as soon as the server refused the credential
    (nats.py would try it again every 0.25 s until the timeout: a refused credential stays
    refused, and every try is a line in the server's log)."""
    task = asyncio.ensure_future(connecting)
    refusal = asyncio.ensure_future(refused.wait())
    try:
        done, _ = await asyncio.wait({task, refusal}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        raise
    finally:
        refusal.cancel()
    if task in done:
        return task.result()
    task.cancel()
    with contextlib.suppress(BaseException):
        await task
    raise TimeoutError("no connection" if not refused.is_set() else "the server refused the credential")


class Bus:
    """A connected bus. Build it with :meth:`Bus.connect`."""

    def __init__(
        self,
        nc: NatsClient,
        *,
        service: str,
        names: BusNames,
        limits: StreamLimits,
        max_payload: int,
        tracer_provider: TracerProvider | None,
        js_domain: str | None = None,
    ) -> None:
        self.nc = nc
        self.js_domain = js_domain
        self.js = nc.jetstream(timeout=10.0, domain=js_domain)
        self.service = service
        self.names = names
        self.subjects = names.subjects
        self.limits = limits
        self.max_payload = max_payload
        self.tracer = tracer(tracer_provider)
        self._kv: dict[str, Kv] = {}
        self._consumers: list[Any] = []
        self._closing = [False]
        self._reconnected = [asyncio.Event()]
        self.lost = asyncio.Event()  # set when the connection closed for good (see connect)

    # connection ---------------------------------------------------------------
    @classmethod
    async def connect(
        cls,
        url: str | list[str] = "nats://127.0.0.1:4222",
        *,
        service: str,
        names: BusNames | None = None,
        limits: StreamLimits | None = None,
        user: str | None = None,
        password: str | None = None,
        creds_file: str | Path | None = None,
        nkey_seed_file: str | Path | None = None,
        tls_ca: str | Path | None = None,
        tls_cert: str | Path | None = None,
        tls_key: str | Path | None = None,
        connect_timeout: float = 10.0,
        inbox_prefix: str | None = None,
        js_domain: str | None = None,
        setup: bool = True,
        max_payload: int = DEFAULT_MAX_PAYLOAD,
        tracer_provider: TracerProvider | None = None,
        once: bool = False,
    ) -> Bus:
        """Connect (reconnecting forever once connected; with ``once``, one try and no
        reconnect: a check of whether a server accepts a credential) and, with ``setup``, create the
        stream and KV buckets if they are missing (never changing existing ones). Raises
        :class:`ConnectError` when no server answers within ``connect_timeout``.

        Authentication: ``user``/``password``, a ``creds_file`` (user JWT + nkey seed; the
        replies then come on ``_INBOX.<its name>``, the only inbox it may subscribe to), or an
        ``nkey_seed_file``. Behind a compute node's leaf nats-server (docs/architecture.md, "Ranks
        on the bus at scale") a client has no credential of its own: ``inbox_prefix`` names the
        only inbox the leaf's credential may subscribe to, and ``js_domain``
        (:data:`~powerguard.bus.names.JS_DOMAIN`) reaches the site's JetStream and KV.
        TLS: ``tls_ca`` verifies the server, ``tls_cert``/``tls_key`` are
        the client certificate (mutual TLS); a ``tls://`` URL without a CA uses the system's."""
        # a string may name several servers of a cluster, comma-separated
        servers = [u.strip() for u in url.split(",") if u.strip()] if isinstance(url, str) else list(url)
        closing = [False]  # set by drain()/close(): expected disconnects are not warnings
        reconnected = [asyncio.Event()]  # set (and replaced) at every reconnect
        # the first connect retries quietly until connect_timeout; its last error becomes the cause
        first: list[BaseException | None] = [None]
        refused: list[BaseException | None] = [None]  # an authorization error outranks what follows it
        connected = [False]
        from .connect_checks import cause, check_files, credential_name

        if creds_file:
            credential_name(creds_file)  # a missing or garbage file is named now, not as a TypeError later
        check_files(nkey_seed_file=nkey_seed_file, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key)
        from powerguard.schemas.file_modes import warn_if_exposed

        for path, what in ((creds_file, "NATS credential"), (nkey_seed_file, "nkey seed"), (tls_key, "TLS key")):
            if path:
                warn_if_exposed(path, what, log)

        from .reconnect import Backoff, FailureLog
        from .reconnect import refused as refusal

        backoff, failures = Backoff(), FailureLog()
        client: list[Any] = [None]  # the connection, once made
        refused_now = asyncio.Event()  # the server refused the credential while connecting
        lost = asyncio.Event()  # the connection closed for good (the server refused it, or close())

        async def on_closed() -> None:
            lost.set()

        async def on_error(exc: Exception) -> None:
            if not connected[0]:
                first[0] = exc
                if "authoriz" in str(exc).lower() or "authentication" in str(exc).lower():
                    refused[0] = exc  # the server then drops the socket: a reset would hide the cause
                    refused_now.set()  # final: trying again for connect_timeout only hammers the server
                log.debug("nats (connecting): %s", exc or type(exc).__name__)
                return
            if closing[0]:
                log.debug("nats: %s", exc or type(exc).__name__)
                return
            nc = client[0]
            if nc is not None and (nc.is_reconnecting or refusal(exc)):  # an attempt to get back failed
                backoff.failed(exc)
                if line := failures.note(exc, time.monotonic(), backoff.nominal()):
                    log.warning("%s", line)
                return
            log.warning("nats: %s", exc or type(exc).__name__)

        async def on_disconnect() -> None:
            if not closing[0]:
                log.warning("nats: disconnected from %s", ", ".join(redact(s) for s in servers))

        async def on_reconnect() -> None:
            tries = backoff.failures
            backoff.connected()
            failures.connected()
            log.info("nats: reconnected" + (f" after {tries} failed attempt(s)" if tries else ""))
            reconnected[0].set()
            reconnected[0] = asyncio.Event()

        options: dict[str, Any] = dict(
            servers=servers,
            name=service,
            allow_reconnect=not once,
            max_reconnect_attempts=0 if once else -1,
            # exponential backoff with jitter (bus/reconnect.py), not a fixed 0.25 s forever
            **({} if once else {"reconnect_to_server_handler": backoff.choose}),
            reconnect_time_wait=0.25,
            connect_timeout=2,
            error_cb=on_error,
            disconnected_cb=on_disconnect,
            reconnected_cb=on_reconnect,
            closed_cb=on_closed,
        )
        if user:
            options.update(user=user, password=password)
        if creds_file:
            from .creds import inbox_of

            options["user_credentials"] = str(creds_file)
            if prefix := inbox_of(creds_file):
                options["inbox_prefix"] = prefix
        if inbox_prefix:
            options["inbox_prefix"] = inbox_prefix
        if nkey_seed_file:
            options["nkeys_seed"] = str(nkey_seed_file)
        if tls_ca or tls_cert or any(s.startswith("tls://") for s in servers):
            import ssl

            ctx = ssl.create_default_context(cafile=str(tls_ca) if tls_ca else None)
            if tls_cert:
                ctx.load_cert_chain(str(tls_cert), str(tls_key) if tls_key else None)
            options["tls"] = ctx
        try:
            nc = await _first_connection(nats.connect(**options), refused_now, connect_timeout)
        except (TimeoutError, OSError, nats.errors.Error) as exc:
            last = refused[0] or (first[0] if first[0] is not None or isinstance(exc, TimeoutError) else exc)
            tried = "" if refused[0] is not None else f" (tried for {connect_timeout:g}s)"
            raise ConnectError(
                f"cannot connect to NATS at {', '.join(redact(s) for s in servers)}{tried}: {cause(last)}"
            ) from None
        connected[0] = True
        client[0] = nc
        bus = cls(
            nc,
            service=service,
            names=names or BusNames(),
            limits=limits or StreamLimits(),
            max_payload=max_payload,
            tracer_provider=tracer_provider,
            js_domain=js_domain,
        )
        bus._closing = closing
        bus._reconnected = reconnected
        bus.lost = lost
        if setup:
            try:
                await bus.setup()
            except BaseException:  # a caller that retries must not leave this connection reconnecting forever
                with contextlib.suppress(Exception):
                    await bus.close()
                raise
        return bus

    @property
    def connected(self) -> bool:
        return self.nc.is_connected

    async def wait_reconnected(self) -> None:
        """Return at the next reconnect (after a lost connection)."""
        await self._reconnected[0].wait()

    async def drain(self) -> None:
        """Stop consumers, flush what is pending, close."""
        self._closing[0] = True
        for consumer in list(self._consumers):
            await consumer.stop()
        if not self.nc.is_closed:
            try:
                await self.nc.drain()
            except (nats.errors.Error, TimeoutError) as exc:
                log.warning("nats: drain failed (%s); closing", exc)
                await self.nc.close()

    async def close(self) -> None:
        self._closing[0] = True
        try:
            for consumer in list(self._consumers):
                with contextlib.suppress(Exception):  # a consumer the server lost: the connection still closes
                    await consumer.stop()
        finally:
            if not self.nc.is_closed:
                await self.nc.close()

    # setup --------------------------------------------------------------------
    def stream_configs(self) -> list[api.StreamConfig]:
        """The deployment's two streams: the site's events, and the training jobs' traffic with
        the server's bounds on what its least trusted writers may store (names.py)."""
        n, lim = self.names, self.limits
        common = dict(
            storage=api.StorageType.FILE,
            retention=api.RetentionPolicy.LIMITS,
            duplicate_window=lim.duplicate_window_s,
            num_replicas=lim.replicas,
            discard=api.DiscardPolicy.OLD,
            allow_direct=True,  # read-only lookups (an agent's last request) need no consumer
        )
        events = api.StreamConfig(
            name=n.stream, subjects=n.subjects.event_trees, max_age=lim.max_age_s, max_bytes=lim.max_bytes, **common
        )
        jobs = api.StreamConfig(
            name=n.jobs_stream,
            subjects=n.subjects.job_trees,
            max_age=lim.jobs_max_age_s,
            max_bytes=lim.jobs_max_bytes,
            max_msgs_per_subject=lim.jobs_max_msgs_per_subject,
            max_msg_size=lim.jobs_max_msg_size,
            **{**common, "discard": api.DiscardPolicy.NEW},
            discard_new_per_subject=True,
        )
        return [events, jobs]

    async def setup(self, *, update: bool = False, patience_s: float = SETUP_PATIENCE_S) -> None:
        """:meth:`_setup_once`, tried again while the servers do not answer in time (a cluster
        electing its streams' leaders after a restart, a store on a slow disk) for up to
        ``patience_s``; a refusal is raised at once. The service's own restart would do the
        same, but only where a supervisor restarts it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + patience_s
        delay = 0.25
        while True:
            try:
                return await self._setup_once(update=update)
            except SetupError as exc:
                if not exc.transient or loop.time() + delay > deadline:
                    raise
                log.warning("%s; trying again in %.2gs", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 4.0)

    async def _setup_once(self, *, update: bool = False) -> None:
        """Create the streams and KV buckets that are missing (idempotent, safe to race). An
        existing stream is never changed (a mismatch is logged) unless ``update`` (``powerguard
        bootstrap --update``, with the admin credential): a client must not be able to undo a
        deployment's replication or limits. The events stream goes first: a deployment of the
        one-stream layout (``pg.>``) must give the jobs' subjects up before their stream exists."""
        n, lim = self.names, self.limits
        try:
            for config in self.stream_configs():
                try:
                    info = await self.js.stream_info(config.name)
                except js_errors.NotFoundError:
                    try:
                        await self.js.add_stream(config)
                    except js_errors.BadRequestError as exc:  # lost a race, or the old layout holds its subjects
                        if "overlap" in str(exc).lower():
                            log.error(
                                "stream %s not created: its subjects %s are another stream's (the one-stream layout "
                                "of an earlier release): run `powerguard bootstrap --update`",
                                config.name,
                                config.subjects,
                            )
                    continue
                have = info.config
                if update:
                    await self.js.update_stream(config)
                elif (have.num_replicas, sorted(have.subjects or [])) != (config.num_replicas, sorted(config.subjects)):
                    log.warning(
                        "stream %s has replicas=%s subjects=%s; expected replicas=%s subjects=%s: left as it is "
                        "(powerguard bootstrap --update changes it)",
                        config.name,
                        have.num_replicas,
                        have.subjects,
                        config.num_replicas,
                        config.subjects,
                    )
            await self._bucket(n.sagas, history=lim.sagas_history, ttl=None)
            await self._bucket(n.status, history=1, ttl=None)
            await self._agents_bucket(update=update)
            await self._bucket(n.leases, history=1, ttl=lim.leases_ttl_s)
            await self._bucket(n.ups, history=5, ttl=None)
            await self._bucket(n.power, history=1, ttl=lim.power_ttl_s)
            # each job's restore floor: no age and no size to push it out (one small value a job)
            await self._bucket(n.floors, history=1, ttl=None, direct=True)
        except (js_errors.APIError, nats.errors.Error, TimeoutError) as exc:
            # no answer in time, or no stream leader yet (503): the servers may answer later
            transient = isinstance(exc, (TimeoutError, nats.errors.TimeoutError, js_errors.ServiceUnavailableError))
            raise SetupError(
                f"cannot set up streams {n.stream}, {n.jobs_stream} and KV buckets: {exc}", transient=transient
            ) from None

    async def bootstrap(self, sites: list[str], *, update: bool = False) -> list[str]:
        """The admin's one-time setup: stream, KV buckets and every site's durable consumers
        with their final configuration (services only bind to them). Returns what exists."""
        from .roles import durable_batches, durable_filters

        await self.setup(update=update)
        made = []
        for site in sites:
            batches = durable_batches(site)
            for name, filters in durable_filters(self.names, site).items():
                want = durable_config(name, filters=filters, deliver="new", batch=batches.get(name, 512))
                stream = self.names.stream_of(filters[0])
                try:
                    info = await self.js.consumer_info(stream, name)
                except js_errors.NotFoundError:
                    try:
                        await self.js.add_consumer(stream, want)
                    except js_errors.NotFoundError:  # its stream is missing: the old one-stream layout
                        log.error(
                            "durable %s not created: stream %s does not exist: run `powerguard bootstrap --update`",
                            name,
                            stream,
                        )
                        continue
                else:
                    have = info.config.filter_subjects or (
                        [info.config.filter_subject] if info.config.filter_subject else []
                    )
                    pending = info.config.max_ack_pending or 0
                    short = 0 < pending < (want.max_ack_pending or 0)  # a release that reads larger batches
                    if update and (sorted(have) != sorted(filters) or short):  # or more subjects (drills)
                        log.warning(
                            "durable %s: filter subjects %s -> %s, max_ack_pending %d -> %d",
                            name,
                            have,
                            filters,
                            pending,
                            max(pending, want.max_ack_pending or 0),
                        )
                        config = info.config
                        config.filter_subject, config.filter_subjects = None, list(filters)
                        config.max_ack_pending = max(pending, want.max_ack_pending or 0)
                        await self.js.add_consumer(stream, config)
                    elif short:
                        log.warning(
                            "durable %s holds at most %d unacknowledged inputs, this release reads batches of "
                            "%d: run `powerguard bootstrap --update`",
                            name,
                            pending,
                            want.max_ack_pending // 4,
                        )
                    if not update and sorted(have) != sorted(filters):
                        log.error(
                            "durable %s reads %s, this release needs %s: run `powerguard bootstrap --update`",
                            name,
                            have,
                            filters,
                        )
                made.append(name)
        return made

    async def _bucket(
        self,
        bucket: str,
        *,
        history: int,
        ttl: float | None,
        storage: api.StorageType = api.StorageType.FILE,
        max_bytes: int | None = None,
        direct: bool = False,
    ) -> Kv:
        try:
            raw = await self.js.key_value(bucket)
        except js_errors.BucketNotFoundError:
            raw = await self.js.create_key_value(
                api.KeyValueConfig(
                    bucket=bucket,
                    history=history,
                    ttl=ttl,
                    storage=storage,
                    replicas=self.limits.replicas,
                    max_bytes=max_bytes,
                    direct=direct,
                )
            )
        kv = Kv(self._in_domain(raw, bucket), bucket)
        self._kv[bucket] = kv
        return kv

    async def _agents_bucket(self, *, update: bool) -> None:
        """The agent registry's bucket, in memory: soft state every rank rewrites at each heartbeat,
        kept off the fsync path (``sync_interval: always`` fsyncs each stored write; at 100,000
        ranks beating every 5 s that is 20,000 writes a second: docs/architecture.md, "The agent
        registry"). A file-backed one from an earlier release is replaced only with ``update``."""
        n = self.names
        stream = f"KV_{n.agents}"
        try:
            info = await self.js.stream_info(stream)
        except js_errors.NotFoundError:
            info = None
        if info is not None and info.config.storage != api.StorageType.MEMORY:
            if not update:
                log.warning(
                    "KV bucket %s is stored on disk (an earlier release): run `powerguard bootstrap --update` to "
                    "move it to memory (its heartbeats fsynced at every write limit how many ranks a broker serves)",
                    n.agents,
                )
            else:
                # soft state: every live rank writes its record again within a heartbeat
                log.warning("KV bucket %s: moved from disk to memory (ranks re-register at their next beat)", n.agents)
                await self.js.delete_stream(stream)
        await self._agents_kv()

    async def _agents_kv(self) -> Kv:
        lim = self.limits
        return await self._bucket(
            self.names.agents,
            history=1,
            ttl=lim.agents_ttl_s,
            storage=api.StorageType.MEMORY,
            max_bytes=lim.agents_max_bytes,
        )

    async def ensure_agents(self) -> tuple[str, bool]:
        """The agent registry's bucket as it is now: ``(incarnation, created)``, creating it if the
        server lost it (``created``). A memory-stored stream of a single nats-server is gone,
        configuration and all, after the server restarts (nats-server#6207); in a cluster its
        configuration outlives any restart. ``incarnation`` (when the server created the bucket)
        tells a watch of the lost one from a watch of this one. The coordinator calls this: it may
        create that one stream and nothing else."""
        n = self.names
        stream = f"KV_{n.agents}"
        created = False
        try:
            info = await self.js.stream_info(stream)
        except js_errors.NotFoundError:
            self._kv.pop(n.agents, None)
            try:
                await self._agents_kv()
                created = True
            except js_errors.BadRequestError:  # made by someone else a moment ago
                pass
            info = await self.js.stream_info(stream)
        return (info.created.isoformat() if info.created else "", created)

    def _in_domain(self, raw: Any, bucket: str) -> Any:
        """Writes to a bucket go through the JetStream domain's API subjects when there is one
        (nats.py prefixes only the API calls, not ``$KV.<bucket>.<key>``)."""
        if self.js_domain:
            raw._pre = f"$JS.{self.js_domain}.API.$KV.{bucket}."
        return raw

    async def kv(self, bucket: str) -> Kv:
        if bucket not in self._kv:
            try:
                self._kv[bucket] = Kv(self._in_domain(await self.js.key_value(bucket), bucket), bucket)
            except js_errors.BucketNotFoundError:
                raise SetupError(
                    f"KV bucket {bucket} does not exist: run `powerguard bootstrap` (the admin creates it)"
                ) from None
        return self._kv[bucket]

    async def sagas(self) -> Kv:
        return await self.kv(self.names.sagas)

    async def status_board(self) -> Kv:
        """Each saga's published status (schemas/status.py): the coordinator writes, tools read."""
        return await self.kv(self.names.status)

    async def agents(self) -> Kv:
        return await self.kv(self.names.agents)

    async def floor(self, job: str) -> Envelope | None:
        """``job``'s restore floor from its own store (a direct read of its key: what a job's
        credential may read), or None: none recorded there (a coordinator before this store)."""
        stream, subject = f"KV_{self.names.floors}", f"$KV.{self.names.floors}.{job}"
        try:
            msg = await self.js.get_msg(stream, subject=subject, direct=True)
        except js_errors.NotFoundError:
            return None
        if not msg.data:
            return None
        return decode_on(self, msg.data, self.subjects.ckpt_recorded(job))

    async def floors(self) -> Kv:
        """Each job's restore floor (``<job>``: its ``CheckpointRecorded``), written by the coordinator."""
        return await self.kv(self.names.floors)

    async def leases(self) -> Kv:
        return await self.kv(self.names.leases)

    async def ups_states(self) -> Kv:
        """Last published power state per UPS (``<site>.<ups>``): monitors claim transitions by CAS."""
        return await self.kv(self.names.ups)

    async def power_actions(self) -> Kv:
        """power-control's record of every command by idempotency key (accepted, running, done)."""
        return await self.kv(self.names.power)

    # publish ------------------------------------------------------------------
    async def publish(
        self, event: Envelope, *, timeout: float = 10.0, headers: dict[str, str] | None = None
    ) -> api.PubAck:
        """Store ``event`` in the stream, exactly once per event id (within the duplicate
        window). Retries through reconnects until ``timeout``; raises :class:`PublishError`."""
        subject = event.nats_subject(self.subjects)
        template = type(event).subject_template(self.subjects.prefix)
        payload = encode(event)
        with self.tracer.start_as_current_span(
            f"publish {template}",
            kind=SpanKind.PRODUCER,
            attributes=messaging_attributes(
                operation="publish",
                subject=subject,
                template=template,
                message_id=event.id,
                event_type=event.type,
            ),
        ) as span:
            hdrs = {"Nats-Msg-Id": event.id, "Ce-Type": event.type, **(headers or {})}
            inject_headers(hdrs)
            deadline = time.monotonic() + timeout
            delay = 0.05
            attempts = 0
            while True:
                remaining = deadline - time.monotonic()
                attempts += 1
                try:
                    # each attempt waits at most PUBLISH_ATTEMPT_S: a stream without a leader (its
                    # host just died) answers nothing, and one attempt must not wait out the whole
                    # timeout while the new leader is elected (the retry is deduplicated by id)
                    ack = await self._publish_once(subject, payload, hdrs, max(0.2, min(remaining, PUBLISH_ATTEMPT_S)))
                except (nats.errors.Error, TimeoutError, OSError) as exc:
                    log.debug("publish attempt failed after %.3fs: %r", time.monotonic() - deadline + timeout, exc)
                    if time.monotonic() + delay >= deadline or self.nc.is_closed:
                        metrics.PUBLISH_ERRORS.labels(event.type).inc()
                        span.set_status(Status(StatusCode.ERROR, str(exc)))
                        raise PublishError(
                            f"{event.short_type} {event.id} on {subject} not stored within {timeout:g}s: "
                            f"{type(exc).__name__} {exc}"
                        ) from None
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 1.0)
                    continue
                span.set_attribute("messaging.nats.stream.sequence", ack.seq)
                if ack.duplicate and attempts > 1:
                    ack = dataclasses.replace(ack, duplicate=False)  # our own earlier attempt was stored
                if ack.duplicate:
                    span.set_attribute("messaging.nats.duplicate", True)
                metrics.PUBLISHED.labels(event.type).inc()
                return ack

    async def _publish_once(self, subject: str, payload: bytes, headers: dict[str, str], timeout: float):
        """One JetStream publish; abandoned at once when the connection is re-established under
        it (the request may have died with the old socket), so a retry need not wait it out."""
        reconnected = self._reconnected[0]
        attempt = asyncio.ensure_future(self.js.publish(subject, payload, timeout=timeout, headers=headers))
        watcher = asyncio.ensure_future(reconnected.wait())
        try:
            await asyncio.wait({attempt, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
        if not attempt.done():
            attempt.cancel()
            raise nats.errors.TimeoutError  # reconnected while waiting: retry (deduplicated by id)
        return attempt.result()

    async def dead_letter(
        self, *, subject: str, payload: bytes, error: BaseException | str, deliveries: int | None = None
    ) -> None:
        """Copy rejected input to ``pg.dlq.<service>``. Never raises."""
        reason = type(error).__name__ if isinstance(error, BaseException) else "Error"
        metrics.DEAD_LETTERS.labels(reason).inc()
        log.error("dead letter from %s: %s", subject, error)
        event = DeadLetter(
            source=f"/powerguard/{self.service}",
            data=DeadLetterData.capture(
                service=self.service, subject=subject, payload=payload, error=error, deliveries=deliveries
            ),
        )
        try:
            await self.publish(event, timeout=5.0)
        except PublishError as exc:
            log.error("could not store dead letter: %s", exc)

    # subscribe ----------------------------------------------------------------
    def subscribe(
        self,
        *types: type[Envelope],
        subject: str | list[str] | None = None,
        deliver: str = "new",
        on_error: Callable[[str, bytes, Exception], None] | None = None,
    ):
        """An async iterator of decoded events for observers and outside tools::

            async for event in bus.subscribe(OnBattery):
                ...

        Uses an ephemeral, unacknowledged consumer. ``deliver`` is ``new``, ``all`` or
        ``last``. Undecodable messages are logged (or passed to ``on_error``) and skipped.
        """

        parts = self.names.split(filter_subjects(self, types, subject))
        subs = [Subscription(self, types, subject=f, deliver=deliver, on_error=on_error) for f in parts.values()]
        return subs[0] if len(subs) == 1 else Merged(subs)

    def listen(self, *types: type[Envelope], subject: str):
        """Live events on ``subject`` through a plain (core NATS) subscription: no JetStream
        consumer, so a least-privileged party needs only the subscribe permission on
        ``subject``. Events published while disconnected are missed (see :meth:`last`)."""

        return Listener(self, types, subject=subject)

    async def last(self, subject: str, *, strict: bool = False) -> Received | None:
        """The newest stored event on ``subject`` (a direct get: a read permission on that
        subject only), or None when there is none. Undecodable or misplaced messages count as
        none. In a cluster any current replica may answer, and one a moment behind the leader
        answers with what it has (nats-server gives direct gets no read-after-write).

        A read that fails (no answer, refused) is logged and taken as none; with ``strict`` it
        raises :class:`ReadError` instead (for a caller that must not take "not read" for "not
        there")."""

        try:
            msg = await self.js.get_last_msg(self.names.stream_of(subject), subject, direct=True)
        except js_errors.NotFoundError:
            return None
        except (js_errors.APIError, nats.errors.Error, TimeoutError) as exc:
            if strict:
                raise ReadError(f"last event on {subject} not read: {type(exc).__name__}: {exc}") from exc
            log.warning("last event on %s not read: %s", subject, exc)
            return None
        try:
            event = decode_on(self, msg.data, msg.subject)
        except EventError as exc:
            log.warning("last event on %s ignored: %s", subject, exc)
            return None
        stored_at = msg.time.timestamp() if getattr(msg, "time", None) else None
        return Received(
            event=event,
            subject=msg.subject,
            headers=dict(msg.headers or {}),
            sequence=msg.seq or 0,
            stored_at=stored_at,
        )

    async def consume(
        self,
        *types: type[Envelope],
        handler: Handler,
        durable: str,
        subject: str | list[str] | None = None,
        max_deliver: int = 5,
        backoff: tuple[float, ...] = (0.2, 1.0, 5.0, 15.0),
        ack_wait: float = 30.0,
        deliver: str = "all",
        since_s: float | None = None,
        max_skew_s: float = MAX_CLOCK_SKEW_S,
    ):
        """Run ``handler`` for every event of ``types`` on a durable consumer.

        Success acks; an exception naks with ``backoff``; after ``max_deliver`` failed
        deliveries the message goes to the DLQ and is terminated. Malformed or unknown input,
        events on a subject their data does not name, and events stamped more than
        ``max_skew_s`` in the future are refused at once (copied to the DLQ within the
        consumer's dead-letter budget: ``dlq_budget.py``). Valid events of other types on the
        same subjects are acked and skipped. With ``since_s``, a durable that has to be created
        starts that many seconds back, not at the stream's start.
        Returns the running :class:`~powerguard.bus.consumer.Consumer`.
        """

        return await self._started(
            Consumer(
                self,
                types,
                handler=handler,
                durable=durable,
                subject=subject,
                max_deliver=max_deliver,
                backoff=backoff,
                ack_wait=ack_wait,
                deliver=deliver,
                since_s=since_s,
                max_skew_s=max_skew_s,
            )
        )

    async def consume_batches(
        self,
        *types: type[Envelope],
        batch_handler: BatchHandler,
        durable: str,
        subject: str | list[str] | None = None,
        batch: int = 256,
        max_deliver: int = 5,
        backoff: tuple[float, ...] = (0.2, 1.0, 5.0, 15.0),
        ack_wait: float = 30.0,
        deliver: str = "all",
        since_s: float | None = None,
        max_skew_s: float = MAX_CLOCK_SKEW_S,
    ):
        """Like :meth:`consume`, but ``batch_handler`` gets up to ``batch`` events at once
        as :class:`~powerguard.bus.consumer.Received` (event, subject, headers, sequence)."""

        return await self._started(
            BatchConsumer(
                self,
                types,
                batch_handler=batch_handler,
                durable=durable,
                subject=subject,
                max_deliver=max_deliver,
                backoff=backoff,
                ack_wait=ack_wait,
                deliver=deliver,
                batch=batch,
                since_s=since_s,
                max_skew_s=max_skew_s,
            )
        )

    async def _started(self, consumer):
        """Start a consumer and keep it, so drain()/close() stop it."""
        await consumer.start()
        self._consumers.append(consumer)
        return consumer

    def _forget(self, consumer: Any) -> None:
        if consumer in self._consumers:
            self._consumers.remove(consumer)
