"""How the runner reports each step of a plan: ``power.action_done`` / ``power.action_failed``
with the device and how long the step took, and ``node.state`` as the node's sequence moves on.
The one way the runner talks to the bus (through ``emit``)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from powerguard.schemas import Envelope, NodeState, NodeStateData, PowerActionDone, PowerActionFailed, PowerResultData

from . import clock

log = logging.getLogger("powerguard.power_control.sequences")
Emit = Callable[[Envelope], Awaitable[Any]]


@dataclass(frozen=True)
class Order:
    """One command as the runner sees it."""

    saga_id: str
    node: str
    key: str
    jobs: tuple[str, ...] = ()
    dry_run: bool = False
    retry: int = 0  # a shutdown commanded again after its off failed: outlets as the fallback


class StepReport:
    def __init__(self, emit: Emit, *, dry_run: bool) -> None:
        self.emit, self.dry_run = emit, dry_run

    async def done(self, o: Order, action: str, device: str | None, started: float, **kw: Any) -> None:
        await self.emit(PowerActionDone(data=self._result(o, action, device, started, **kw)))

    async def failed(self, o: Order, action: str, device: str | None, started: float, error: str, **kw: Any) -> None:
        log.warning("%s %s on %s failed: %s", o.key, action, o.node, error)
        await self.emit(PowerActionFailed(data=self._result(o, action, device, started, error=error, **kw)))

    def _result(self, o: Order, action: str, device: str | None, started: float, **kw: Any) -> PowerResultData:
        return PowerResultData(
            saga_id=o.saga_id,
            node=o.node,
            action=action,
            idempotency_key=o.key,
            device=device,
            duration_s=round(max(0.0, clock.now() - started), 3),
            dry_run=o.dry_run or self.dry_run,
            **kw,
        )

    async def node_state(self, o: Order, state: str, detail: str | None = None) -> None:
        await self.emit(NodeState(data=NodeStateData(node=o.node, state=state, saga_id=o.saga_id, detail=detail)))
