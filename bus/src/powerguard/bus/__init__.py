"""PowerGuard's typed NATS JetStream bus: publish/subscribe typed events, stream and KV
setup, OTel propagation, an embedded broker and the service runner.

    bus = await Bus.connect("nats://127.0.0.1:4222", service="my-tool")
    await bus.publish(OnBattery(data=PowerData(site="dc1", ups="ups1", on_battery=True)))
    async for event in bus.subscribe(OnBattery):
        print(event.data.runtime_s)
"""

from .client import Bus
from .consumer import BatchConsumer, BatchHandler, Consumer, Handler, Received, Subscription
from .embedded import EmbeddedNats, embedded_cluster, find_nats_server, free_ports
from .errors import (
    BusError,
    CasConflict,
    ConnectError,
    EmbeddedServerError,
    PublishError,
    ReadError,
    RegistrationRefused,
    SetupError,
)
from .kv import Kv, KvEntry
from .names import BusNames, StreamLimits
from .runner import ReadyLog, ServiceContext, run_service, service_main

__all__ = [
    "BatchConsumer",
    "BatchHandler",
    "Bus",
    "BusError",
    "BusNames",
    "CasConflict",
    "ConnectError",
    "Consumer",
    "EmbeddedNats",
    "embedded_cluster",
    "free_ports",
    "EmbeddedServerError",
    "Handler",
    "Kv",
    "KvEntry",
    "PublishError",
    "ReadError",
    "RegistrationRefused",
    "ReadyLog",
    "Received",
    "ServiceContext",
    "SetupError",
    "StreamLimits",
    "Subscription",
    "find_nats_server",
    "run_service",
    "service_main",
]
