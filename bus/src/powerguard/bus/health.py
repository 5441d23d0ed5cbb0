"""JetStream health as Prometheus metrics: what PowerGuard's own failures look like on the bus -
a service's durable consumer falling behind (the coordinator not reading power events), messages
redelivered, dead letters per service, the stream and its replicas, the KV buckets.

``collect()`` reads it with the observer's permissions (stream and consumer info, the buckets'
stream info, no value and no publish); ``JetStreamHealth`` keeps gauges current on a timer;
``python -m powerguard.bus.health`` serves them on ``/metrics`` for Prometheus (the unit
``powerguard-exporter.service``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import time
from dataclasses import dataclass, field

from prometheus_client import Gauge

from .client import Bus
from .roles import SERVICES, durable_filters

log = logging.getLogger("powerguard.bus.health")


UP = Gauge("powerguard_jetstream_up", "1 when the last read of the stream and consumers succeeded")
CONSUMER_PENDING = Gauge(
    "powerguard_jetstream_consumer_pending", "Messages stored but not yet delivered to the durable", ["consumer"]
)
CONSUMER_ACK_PENDING = Gauge(
    "powerguard_jetstream_consumer_ack_pending", "Messages delivered and not yet acknowledged", ["consumer"]
)
CONSUMER_REDELIVERED = Gauge(
    "powerguard_jetstream_consumer_redelivered", "Messages delivered more than once, not yet acknowledged", ["consumer"]
)
CONSUMER_ACK_FLOOR_AGE = Gauge(
    "powerguard_jetstream_consumer_ack_floor_age_seconds",
    "Seconds since the durable's ack floor last moved (with messages pending: how long it has been stuck)",
    ["consumer"],
)
CONSUMER_LAG = Gauge(
    "powerguard_jetstream_consumer_lag_seconds",
    "Age of the oldest message the durable has not yet acknowledged (0: none waiting): how late its input is "
    "handled, even while a flood keeps its ack floor moving",
    ["consumer"],
)
CONSUMER_PRESENT = Gauge("powerguard_jetstream_consumer_present", "1 when the durable exists", ["consumer"])
STREAM_MESSAGES = Gauge("powerguard_jetstream_stream_messages", "Messages in the events stream", ["stream"])
STREAM_BYTES = Gauge("powerguard_jetstream_stream_bytes", "Bytes in the events stream", ["stream"])
STREAM_REPLICAS = Gauge("powerguard_jetstream_stream_replicas", "Replicas the stream is configured with", ["stream"])
STREAM_REPLICAS_CURRENT = Gauge(
    "powerguard_jetstream_stream_replicas_current", "Replicas that are current (the leader included)", ["stream"]
)
STREAM_LEADER = Gauge("powerguard_jetstream_stream_has_leader", "1 when the stream has a leader", ["stream"])
DEAD_LETTERS = Gauge(
    "powerguard_jetstream_dead_letters", "Messages in the DLQ, per service that rejected them", ["service"]
)
KV_VALUES = Gauge("powerguard_jetstream_kv_values", "Values (with history) in a KV bucket", ["bucket"])
KV_PRESENT = Gauge("powerguard_jetstream_kv_present", "1 when the KV bucket exists", ["bucket"])


@dataclass
class Snapshot:
    """What one read found (also what the tests look at)."""

    consumers: dict[str, dict[str, float]] = field(default_factory=dict)
    streams: dict[str, dict[str, float]] = field(default_factory=dict)  # stream -> its figures
    dead_letters: dict[str, int] = field(default_factory=dict)
    kv: dict[str, int | None] = field(default_factory=dict)


async def collect(bus: Bus, site: str, *, now: float | None = None, timeout_s: float = 2.0) -> Snapshot:
    """Read the stream, the site's durables, the DLQ counts and the buckets; each read bounded by
    ``timeout_s`` (a refresh never outlasts its interval waiting on one answer)."""
    now = time.time() if now is None else now
    snap = Snapshot()
    for name in bus.names.streams:  # the site's events, the jobs' traffic
        events = name == bus.names.stream
        dlq = bus.subjects.dlq("*") if events else None
        info = await asyncio.wait_for(bus.js.stream_info(name, subjects_filter=dlq), timeout_s)
        snap.streams[name] = {
            "messages": info.state.messages,
            "bytes": info.state.bytes,
            "replicas": info.config.num_replicas or 1,
            "replicas_current": 1 + sum(1 for p in (info.cluster.replicas or []) if p.current) if info.cluster else 1,
            "has_leader": 1 if (info.cluster is None or info.cluster.leader) else 0,
        }
        if events:
            # every service's count exists from the start (0), so the first dead letter is a change
            snap.dead_letters = dict.fromkeys(SERVICES, 0)
            for subject, count in (info.state.subjects or {}).items():
                snap.dead_letters[subject.rsplit(".", 1)[-1]] = count
    for durable, filters in durable_filters(bus.names, site).items():
        try:
            c = await asyncio.wait_for(bus.js.consumer_info(bus.names.stream_of(filters[0]), durable), timeout_s)
        except Exception as exc:
            log.warning("durable %s not read: %s", durable, exc)
            snap.consumers[durable] = {"present": 0}
            continue
        floor = c.ack_floor.last_active if c.ack_floor is not None else None
        since = floor or c.created  # the floor never moved: since the durable was made
        age = max(0.0, now - since.timestamp()) if since is not None else 0.0
        waiting = (c.num_pending or 0) + (c.num_ack_pending or 0)
        snap.consumers[durable] = {
            "present": 1,
            "pending": c.num_pending or 0,
            "ack_pending": c.num_ack_pending or 0,
            "redelivered": c.num_redelivered or 0,
            "ack_floor_age_s": age,
            "lag_s": await _oldest_waiting_age(bus, c, now, timeout_s) if waiting else 0.0,
        }
    for bucket in (
        bus.names.sagas,
        bus.names.status,
        bus.names.agents,
        bus.names.leases,
        bus.names.ups,
        bus.names.power,
        bus.names.floors,
    ):
        try:
            kv = await asyncio.wait_for(bus.js.stream_info(f"KV_{bucket}"), timeout_s)
            snap.kv[bucket] = kv.state.messages
        except Exception as exc:
            if "not found" not in str(exc).lower():
                log.warning("bucket %s not read: %r", bucket, exc)
            snap.kv[bucket] = None
    return snap


async def _oldest_waiting_age(bus: Bus, c, now: float, timeout_s: float) -> float:
    """The age of the first message past the durable's ack floor on any of its subjects (a
    direct get of the next message by subject: the observer's read permission)."""
    first = (c.ack_floor.stream_seq if c.ack_floor is not None else 0) + 1
    filters = c.config.filter_subjects or [c.config.filter_subject or bus.subjects.all]
    stamps = []
    for subject in filters:
        try:
            msg = await asyncio.wait_for(
                bus.js.get_msg(c.stream_name, seq=first, subject=subject, next=True, direct=True), timeout_s
            )
        except Exception:  # nothing on that subject past the floor
            continue
        if msg.time is not None:
            stamps.append(msg.time.timestamp())
    return max(0.0, now - min(stamps)) if stamps else 0.0


def publish(snap: Snapshot) -> None:
    """Set the gauges from a snapshot."""
    for name, c in snap.consumers.items():
        CONSUMER_PRESENT.labels(name).set(c["present"])
        if c["present"]:
            CONSUMER_PENDING.labels(name).set(c["pending"])
            CONSUMER_ACK_PENDING.labels(name).set(c["ack_pending"])
            CONSUMER_REDELIVERED.labels(name).set(c["redelivered"])
            CONSUMER_ACK_FLOOR_AGE.labels(name).set(c["ack_floor_age_s"])
            CONSUMER_LAG.labels(name).set(c["lag_s"])
    for stream, f in snap.streams.items():
        STREAM_MESSAGES.labels(stream).set(f["messages"])
        STREAM_BYTES.labels(stream).set(f["bytes"])
        STREAM_REPLICAS.labels(stream).set(f["replicas"])
        STREAM_REPLICAS_CURRENT.labels(stream).set(f["replicas_current"])
        STREAM_LEADER.labels(stream).set(f["has_leader"])
    for service, count in snap.dead_letters.items():
        DEAD_LETTERS.labels(service).set(count)
    for bucket, values in snap.kv.items():
        KV_PRESENT.labels(bucket).set(0 if values is None else 1)
        if values is not None:
            KV_VALUES.labels(bucket).set(values)


class JetStreamHealth:
    """Keeps the gauges current every ``every_s``; a failed read sets ``powerguard_jetstream_up`` 0."""

    def __init__(self, bus: Bus, site: str, *, every_s: float = 5.0) -> None:
        self.bus, self.site, self.every_s = bus, site, every_s
        self._task: asyncio.Task | None = None

    async def refresh(self) -> Snapshot | None:
        try:
            snap = await collect(self.bus, self.site, timeout_s=max(0.5, min(2.0, self.every_s / 4)))
        except Exception as exc:
            log.warning("JetStream health not read: %s", exc)
            UP.set(0)
            return None
        publish(snap)
        UP.set(1)
        return snap

    def start(self) -> None:
        async def loop() -> None:
            while True:
                await self.refresh()
                await asyncio.sleep(self.every_s)

        self._task = asyncio.create_task(loop(), name="jetstream-health")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass


async def _serve(args: argparse.Namespace, site) -> None:
    import signal

    from .env import connection
    from .http import HealthServer
    from .names import BusNames

    url, auth = connection(site.nats, url=args.nats_url, creds=args.creds, ca=args.ca)
    bus = await Bus.connect(
        url, service="jetstream-exporter", names=BusNames.from_settings(site.nats), setup=False, **auth
    )
    health = JetStreamHealth(bus, site.site, every_s=args.every_s)
    health.start()
    server = HealthServer(host=args.http_host, port=args.http_port, ready=lambda: (True, "ok"))
    port = await server.start()
    log.info("JetStream health metrics on http://%s:%d/metrics", args.http_host, port)
    print(f"JetStream health metrics on http://{args.http_host}:{port}/metrics", flush=True)
    done = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, done.set)
    try:
        await done.wait()
    finally:
        await health.stop()
        await server.stop()
        await bus.close()


def main(argv: list[str] | None = None) -> None:
    from .env import PRECEDENCE

    p = argparse.ArgumentParser(
        prog="python -m powerguard.bus.health",
        description="Serve JetStream health (durable lag, redeliveries, dead letters, stream replicas, KV buckets) "
        "as Prometheus metrics on /metrics. Needs only the observer's credential.",
        epilog=PRECEDENCE,
    )
    p.add_argument(
        "--config", "-c", default=os.environ.get("POWERGUARD_CONFIG"), help="Site YAML (env POWERGUARD_CONFIG)"
    )
    p.add_argument("--nats-url", "--url", help="NATS URL (env NATS_URL; the site file's)")
    p.add_argument("--creds", help="the observer's credential (env NATS_CREDS; the site file's)")
    p.add_argument("--ca", help="CA of the server's certificate (env NATS_CA; the site file's)")
    p.add_argument("--http-host", default="127.0.0.1", help="address to serve /metrics on (default 127.0.0.1)")
    p.add_argument("--http-port", type=int, default=9104, help="port (default 9104; 0: a free one, printed)")
    p.add_argument("--every-s", type=float, default=5.0, help="how often JetStream is read (default 5 s)")
    from .version import version

    p.add_argument("--version", action="version", version=f"powerguard-exporter {version('exporter')}")
    args = p.parse_args(argv)
    if not args.config:
        p.error("give --config site.yaml (or POWERGUARD_CONFIG)")
    from powerguard.schemas import PowerGuardError, load_site

    from .logs import configure_logging

    configure_logging("exporter")  # the services' one JSON format
    from .version import announce

    log.info("powerguard-exporter %s starting", announce("exporter"))
    try:
        site = load_site(args.config)
    except PowerGuardError as exc:  # a configuration error: exit 2, which the unit does not restart
        p.exit(2, f"error: {exc}\n")
    try:
        asyncio.run(_serve(args, site))
    except PowerGuardError as exc:
        p.exit(1, f"error: {exc}\n")


if __name__ == "__main__":
    main()
