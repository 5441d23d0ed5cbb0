"""Can power-control reach what it must act on? Every node's BMC (its secrets read, its power
state answered) and every PDU outlet it switches, checked at start and every
``device_check_s``. A node it cannot act on makes the service *degraded*: /readyz says which
nodes and why, ``powerguard_power_device_ok`` is 0 for them (the alert PowerDeviceUnreachable), and
the log says it once per change. The verdict is pure; :func:`check` does the I/O."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from powerguard.schemas import PowerGuardError

from . import metrics
from .drivers import Devices
from .errors import PowerControlError

log = logging.getLogger(__name__)


@dataclass
class DeviceHealth:
    """node -> what is wrong with its devices (absent: fine)."""

    problems: dict[str, str] = field(default_factory=dict)
    checked: bool = False

    def verdict(self) -> tuple[bool, str]:
        if not self.checked:
            return False, "devices not checked yet"
        if not self.problems:
            return True, "ok"
        nodes = sorted(self.problems)
        return False, f"degraded: {len(nodes)} node(s) cannot be acted on: " + "; ".join(
            f"{n}: {self.problems[n]}" for n in nodes
        )


async def node_problem(devices: Devices, node: str, timeout_s: float) -> str | None:
    """What keeps power-control from acting on ``node`` now, or None. Never raises."""
    cfg = devices.node(node)
    try:
        bmc = devices.bmc(node)  # reads the BMC's secrets, now (a file removed since is seen here)
        if bmc is not None:
            await asyncio.wait_for(bmc.status(), timeout_s)
        for ref in cfg.outlets:
            if why := devices.pdu_secrets_problem(ref.pdu):
                return why
            await asyncio.wait_for(devices.pdu(ref.pdu).outlet_state(ref.outlet), timeout_s)
    except TimeoutError:
        return f"no answer within {timeout_s:g}s"
    except (PowerControlError, PowerGuardError, OSError) as exc:
        return (str(exc) or type(exc).__name__).removeprefix(f"node {node}: ")
    return None


async def check(devices: Devices, site: str, nodes: list[str], timeout_s: float) -> DeviceHealth:
    """Every node's devices, concurrently; the metric set per node."""
    found = await asyncio.gather(*(node_problem(devices, n, timeout_s) for n in nodes))
    health = DeviceHealth({n: p for n, p in zip(nodes, found, strict=True) if p is not None}, checked=True)
    for n in nodes:
        metrics.DEVICE_OK.labels(site, n).set(0 if n in health.problems else 1)
    return health
