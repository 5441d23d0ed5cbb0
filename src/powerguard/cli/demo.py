"""``powerguard demo``.

Until the simulated site and the services land (issues 3-7), the demo runs the event
contract end to end on an embedded nats-server: a power event is published as ups-monitor
would, a durable consumer receives it as the coordinator would, and the round trip, the
deduplication of a second monitor's copy and the shared trace id are reported.
"""

from __future__ import annotations

import asyncio
import tempfile
import time

from rich.console import Console
from rich.table import Table

from powerguard.bus import Bus, BusNames, EmbeddedNats
from powerguard.bus.tracing import configure_tracing
from powerguard.schemas import Envelope, OnBattery, PowerData, deterministic_id


async def run_demo(console: Console) -> dict:
    configure_tracing("powerguard-demo")
    with tempfile.TemporaryDirectory(prefix="pg-demo-") as tmp, EmbeddedNats(store_dir=tmp) as server:
        console.print(f"[bold]embedded nats-server[/bold] at {server.url}")
        names = BusNames()
        monitor_a = await Bus.connect(server.url, service="ups-monitor-a", names=names)
        monitor_b = await Bus.connect(server.url, service="ups-monitor-b", names=names, setup=False)
        coordinator = await Bus.connect(server.url, service="coordinator", names=names, setup=False)
        received: asyncio.Queue[tuple[Envelope, float]] = asyncio.Queue()

        async def on_power(event: Envelope) -> None:
            await received.put((event, time.perf_counter()))

        await coordinator.consume(OnBattery, handler=on_power, durable="coordinator-demo", deliver="new")
        transition = deterministic_id("demo", "ups1", "on_battery", 1)
        reading = PowerData(
            site="demo",
            ups="ups1",
            on_battery=True,
            status=["OB", "DISCHRG"],
            charge_pct=97.0,
            runtime_s=540.0,
            load_pct=50.0,
            input_v=0.0,
            via="poll",
        )
        t0 = time.perf_counter()
        ack_a = await monitor_a.publish(OnBattery(id=transition, source="/powerguard/ups-monitor-a", data=reading))
        ack_b = await monitor_b.publish(OnBattery(id=transition, source="/powerguard/ups-monitor-b", data=reading))
        event, t1 = await asyncio.wait_for(received.get(), 10)
        await asyncio.sleep(0.2)
        extra = received.qsize()
        for bus in (coordinator, monitor_b, monitor_a):
            await bus.drain()

    table = Table(title="event contract round trip")
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_row("on_battery published -> consumed", f"{(t1 - t0) * 1000:.1f} ms")
    table.add_row("copies stored (2 monitors, 1 transition)", str(1 + (0 if ack_b.duplicate else 1)))
    table.add_row("copies delivered", str(1 + extra))
    table.add_row("runtime remaining", f"{event.data.runtime_s:.0f} s")
    console.print(table)
    console.print(
        "[dim]The full outage drill (simulated UPS, BMCs, training ranks) arrives with the "
        "services; see the README.[/dim]"
    )
    return {
        "scenario": "contract",
        "latency_ms": round((t1 - t0) * 1000, 2),
        "duplicate_dropped": bool(ack_b.duplicate),
        "delivered": 1 + extra,
        "stream_seq": ack_a.seq,
    }
