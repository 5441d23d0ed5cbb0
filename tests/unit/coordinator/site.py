"""A driver for the coordinator's pure site core: real event envelopes, a fake clock, no NATS."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import count

from powerguard.coordinator.core import SiteCore, Step
from powerguard.coordinator.inputs import Command
from powerguard.schemas import (
    CheckpointDurable,
    CheckpointDurableData,
    CheckpointFailed,
    CheckpointFailedData,
    Envelope,
    JobData,
    JobResumed,
    NodeState,
    NodeStateData,
    OnBattery,
    OnLine,
    PowerData,
)

from .harness import POLICY, TOPO, registry


def at(now: float) -> datetime:
    return datetime.fromtimestamp(now, UTC)


@dataclass
class Site:
    """Feeds events to a :class:`SiteCore` at a fake time and keeps everything it said."""

    now: float = 1000.0
    policy: object = POLICY
    core: SiteCore = field(init=False)
    steps: list[Step] = field(default_factory=list)
    _ids: count = field(default_factory=lambda: count(1))

    def __post_init__(self) -> None:
        self.core = SiteCore(TOPO, self.policy, registry=registry(), saga_id=lambda site, now: f"s{next(self._ids)}")

    def send(self, *events: Envelope) -> Step:
        step = self.core.apply([(e, None) for e in events], self.now)
        self.steps.append(step)
        return step

    def advance(self, seconds: float) -> Step:
        self.now += seconds
        step = self.core.tick(self.now)
        self.steps.append(step)
        return step

    # ------------------------------------------------------------------ events
    def power(
        self,
        ups: str,
        on_battery: bool,
        *,
        runtime_s: float | None = 300.0,
        charge_pct: float = 90.0,
        age_s: float = 0.0,
        **kw,
    ):
        cls = OnBattery if on_battery else OnLine
        data = PowerData(site="dc1", ups=ups, on_battery=on_battery, runtime_s=runtime_s, charge_pct=charge_pct, **kw)
        return cls(time=at(self.now - age_s), data=data)

    def ack(
        self,
        saga_id: str,
        job: str,
        rank: int,
        *,
        round: str = "ckpt",
        step: int = 101,
        durability: str = "local",
        ranks: list[tuple[int, int]] | None = None,
    ) -> CheckpointDurable:
        return CheckpointDurable(
            data=CheckpointDurableData(
                request_id=f"{saga_id}/{job}/{round}",
                saga_id=saga_id,
                job=job,
                rank=rank,
                step=step,
                path="/ckpt",
                bytes=1,
                digest="0" * 32,
                durability=durability,
                ranks=ranks,
            )
        )

    @staticmethod
    def failed(saga_id: str, job: str, rank: int, request_id: str) -> CheckpointFailed:
        return CheckpointFailed(
            data=CheckpointFailedData(
                request_id=request_id, saga_id=saga_id, job=job, rank=rank, step=101, error="disk full"
            )
        )

    def acks(self, saga_id: str, job: str, **kw) -> list[CheckpointDurable]:
        rec = self.core.open[saga_id]
        return [self.ack(saga_id, job, r, **kw) for r in range(rec.jobs[job].world_size)]

    @staticmethod
    def node(node: str, state: str, saga_id: str | None, detail: str | None = None) -> NodeState:
        return NodeState(data=NodeStateData(node=node, state=state, saga_id=saga_id, detail=detail))

    @staticmethod
    def resumed(job: str, saga_id: str | None, step: int = 101) -> JobResumed:
        return JobResumed(data=JobData(job=job, saga_id=saga_id, step=step))

    # ------------------------------------------------------------------ what came out
    @property
    def commands(self) -> list[Command]:
        return [c for s in self.steps for cmds in s.commands.values() for c in cmds]

    def kinds(self, step: Step | None = None) -> list[tuple[str, str]]:
        steps = [step] if step is not None else self.steps
        return [(c.kind, c.target) for s in steps for cmds in s.commands.values() for c in cmds]

    def notices(self) -> list[str]:
        return [n.reason for s in self.steps for n in s.notices]
