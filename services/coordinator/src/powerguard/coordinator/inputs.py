"""The saga's vocabulary: the inputs it handles (one UPS reading, an ack, a node's report, a
job resumed, a UPS's answer, a clock tick) and the commands it issues. Plain frozen values;
the shell (``service.py``) makes them from events and turns commands into events
(``outbox.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass(frozen=True)
class Power:
    """A reading of one UPS (any power event or telemetry)."""

    ups: str
    on_battery: bool
    runtime_s: float | None = None
    charge_pct: float | None = None
    low_battery: bool = False
    fsd: bool = False
    drill: bool = False  # a synthetic reading from `powerguard drill`
    load_pct: float | None = None


@dataclass(frozen=True)
class Ack:
    job: str
    rank: int
    request_id: str | None
    step: int | None = None
    ok: bool = True
    error: str | None = None
    durability: str = "local"  # local | replicated:k | remote (a later ack of the same rank may raise it)
    commit: str | None = None  # the committed checkpoint's contents id (the ckpt-agent's _layout.commit_id)
    ranks: tuple[tuple[int, int], ...] | None = None  # rank 0 acking for these [first, last] spans (one ack per job)


@dataclass(frozen=True)
class NodeReport:
    node: str
    state: Literal["off", "ready", "failed_off", "failed_on"]
    detail: str | None = None


@dataclass(frozen=True)
class Resumed:
    job: str
    step: int | None


@dataclass(frozen=True)
class UpsReport:
    """What a UPS did with the saga's output command."""

    ups: str
    ok: bool
    detail: str | None = None


@dataclass(frozen=True)
class Tick:
    pass


Input = Power | Ack | NodeReport | Resumed | UpsReport | Tick


CommandKind = Literal[
    "ckpt_request", "release", "ckpt_recorded", "job_stop", "shutdown", "power_on", "job_restart", "ups_off"
]


@dataclass(frozen=True)
class Command:
    kind: CommandKind
    key: str  # idempotency key: <saga>/<target>/<action>
    target: str  # job or node
    args: dict[str, Any] = field(default_factory=dict, compare=False)
