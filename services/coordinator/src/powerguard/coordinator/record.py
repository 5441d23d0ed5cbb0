"""The saga's record: what the coordinator stores in KV for one outage (``pg_sagas``, through
``store.py``), and what every decision reads. Models only: the transitions that change a
record are in ``saga.py``, the battery rules that read it in ``budget.py``.

How it is stored (sets sorted, ranks as runs, node plans without unset fields) is the
store's business: :mod:`.store_format`.
"""

from __future__ import annotations

import secrets
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

from pydantic import BaseModel, Field, PrivateAttr, field_serializer

from powerguard.schemas import HoldPolicy, SagaState

S = SagaState


class UpsView(BaseModel):
    on_battery: bool = False
    runtime_s: float | None = None
    charge_pct: float | None = None
    low_battery: bool = False
    fsd: bool = False
    since: float = 0.0  # when on_battery last changed
    drill: bool = False  # on battery only in a drill
    load_pct: float | None = None
    samples: list[list[float]] = Field(default_factory=list)  # on battery: [t, charge %, load % or -1]
    start_charge_pct: float | None = None  # when it went on battery
    start_runtime_s: float | None = None  # the UPS's own estimate then (judged against what happened)


@dataclass(frozen=True)
class Supply:
    """What the battery-budget rules (:mod:`.budget`) read of a saga or of the site."""

    ups: Mapping[str, UpsView]
    shutdown_need: Mapping[str, float] = field(default_factory=dict)  # node group -> measured shutdown, s

    @property
    def on_battery(self) -> list[str]:
        return sorted(u for u, v in self.ups.items() if v.on_battery)


class BatteryFigures(BaseModel):
    """One UPS in one outage: its own first runtime estimate against the runtime the observed
    discharge gives (at the load observed), recorded when it went back on line."""

    predicted_s: float | None = None
    observed_s: float | None = None
    load_pct: float | None = None
    on_battery_s: float = 0.0

    @property
    def ratio(self) -> float | None:
        """Observed over predicted: below 1 the UPS's estimate was optimistic (an aged battery)."""
        if not self.predicted_s or self.observed_s is None:
            return None
        return self.observed_s / self.predicted_s


class CkptRound(BaseModel):
    """One checkpoint request to every rank of a job and the answers to it."""

    request_id: str
    world_size: int
    requested_at: float | None = None
    deadline: float | None = None
    told_deadline: float | None = None  # the deadline the ranks were last sent
    acked: dict[int, int | None] = Field(default_factory=dict)  # rank -> step
    failed: dict[int, str] = Field(default_factory=dict)
    settled_at: float | None = None  # every rank answered, or the deadline passed
    levels: dict[int, str] = Field(default_factory=dict)  # rank -> the best durability it reported
    require: str = "local"  # the durability every rank must reach before the round counts answered
    commit: str | None = None  # the committed checkpoint the acks named (its contents id)

    @property
    def missing(self) -> list[int]:
        return [r for r in range(self.world_size) if r not in self.acked]

    @property
    def short(self) -> list[int]:
        """Ranks that acked, below the required durability (still waited for until the deadline)."""
        return [r for r in self.acked if not meets(self.levels.get(r, "local"), self.require)]

    # how many acked ranks are below ``require``: counted once (after a load or a new
    # requirement), then kept as acks raise ranks (:meth:`take`), so a raise costs what it changes
    _short: int | None = PrivateAttr(default=None)

    def __eq__(self, other: object) -> bool:
        """Equal fields are equal rounds (the kept count is derived from them, not compared)."""
        return type(other) is type(self) and self.__dict__ == other.__dict__

    def take(self, rank: int, step: int | None, level: str) -> None:
        """Rank ``rank`` acked ``step`` at ``level``: kept, the level only ever raised (a later
        ack of replicas or the remote copy), a failure it had reported dropped."""
        if self._short is None:
            self._short = len(self.short)
        before = self.levels.get(rank, "local")
        was_short = rank in self.acked and not meets(before, self.require)
        self.acked[rank] = step
        self.failed.pop(rank, None)
        if strength(level) >= strength(before):
            self.levels[rank] = level
        self._short += (not meets(self.levels.get(rank, "local"), self.require)) - was_short

    def requiring(self, require: str) -> None:
        """The durability every rank must reach (the count of short ranks made again when it changes)."""
        if require != self.require:  # (a model's attribute set costs a validation: not once per ack)
            self.require = require
            self._short = None

    @property
    def answered(self) -> bool:
        # acked and failed never share a rank (facts.ack), so their sizes say whether all answered
        if len(self.acked) + len(self.failed) < self.world_size:
            return False  # some rank has not answered (and no set is built per ack at 100k ranks)
        if self._short is None:
            self._short = len(self.short)
        return self._short == 0

    @property
    def step(self) -> int | None:
        steps = {s for s in self.acked.values() if s is not None}
        return max(steps) if steps else None

    @property
    def complete(self) -> bool:
        """Every rank acked durable: the job can restart from this step."""
        return self.settled_at is not None and not self.missing

    @property
    def duration_s(self) -> float | None:
        """How long the whole job took to make it durable (the estimate for the next one)."""
        if not self.complete or self.requested_at is None:
            return None
        return self.settled_at - self.requested_at


def meets(level: str, require: str) -> bool:
    """Whether an ack's durability satisfies a requirement: replicated is met by replicated:k>=1
    or remote; remote only by remote; local by anything."""
    if require == "local":
        return True
    if require == "remote":
        return level == "remote"
    return level == "remote" or (level.startswith("replicated:") and level != "replicated:0")


def strength(level: str) -> int:
    """How durable an ack's level is, for keeping the strongest a rank reported."""
    if level == "remote":
        return 1 << 30
    return int(level.split(":", 1)[1]) if level.startswith("replicated:") and level[11:].isdigit() else 0


class JobPlan(CkptRound):
    """A job in the outage: its power checkpoint (the round itself), its final checkpoint at the
    stop, where it stopped and where it resumed."""

    job: str
    ranks: dict[int, str]  # rank -> node at detection (stored as runs: store_format.py)
    step_at_detection: int | None = None
    hold_policy: HoldPolicy = "checkpoint-at-stop"
    final: CkptRound | None = None  # the checkpoint at the stop (checkpoint-at-stop)
    final_note: str | None = None  # why there was no final checkpoint, or how it ended
    hold: CkptRound | None = None  # the latest checkpoint during the hold (checkpoint-at-stop: hold.N)
    hold_rounds: int = 0  # how many were requested
    hold_step: int | None = None  # the newest step a hold checkpoint made durable on every rank
    hold_commit: str | None = None  # the checkpoint of hold_step the acks named
    recorded_step: int | None = None  # the newest durable step announced (pg.ckpt.<job>.recorded)
    stopped_at: float | None = None  # the shutdown was decided (job stop issued)
    stop_step: int | None = None  # newest step the job had trained when it was stopped
    stop_step_exact: bool = False  # ranks were waiting at that step (else: the newest step reported)
    restart_at: float | None = None
    kept_running: bool = False  # power returned before the shutdown and the job was heard alive: no restart
    resumed_at: float | None = None
    resumed_step: int | None = None
    attempt: int = 1  # the power round's attempt (a failed one is requested again: ckpt.2, ...)

    @property
    def durable_step(self) -> int | None:
        """Newest step every rank made durable in this outage (the power, a hold or the final
        checkpoint)."""
        steps = [
            x
            for x in (
                self.final.step if self.final is not None and self.final.complete else None,
                self.hold_step,
                self.step if self.complete else None,
            )
            if x is not None
        ]
        return max(steps) if steps else None

    @property
    def durable_commit(self) -> str | None:
        """The checkpoint of :attr:`durable_step` the acks named (None: no ack named one)."""
        step = self.durable_step
        if self.final is not None and self.final.complete and self.final.step == step:
            return self.final.commit
        if self.complete and self.step == step:
            return self.commit
        return self.hold_commit if self.hold_step == step else None

    @property
    def paused(self) -> bool:
        """Its ranks were asked to wait at a step boundary (they need a release if power returns)."""
        return self.hold_policy == "pause" or self.final is not None


class NodePlan(BaseModel):
    node: str
    shutdown_at: float | None = None
    off_at: float | None = None
    power_on_at: float | None = None
    ready_at: float | None = None
    error: str | None = None
    waiting: str | None = None  # why a node to restore is still off (power-control's ramp)
    off_retry: int | None = None  # the off was commanded again this many times (it failed before)
    in_doubt: str | None = None  # after its off, before any power-on: reported on (by hand) or a later off failed


class UpsOffPlan(BaseModel):
    """A UPS told to cut its output and return: when, why, and what it said."""

    told_at: float
    delay_s: float
    reason: str
    nodes: list[str] = Field(default_factory=list)  # what loses power with it
    done_at: float | None = None
    error: str | None = None


class Transition(BaseModel):
    state: SagaState
    at: float
    reason: str | None = None


class SagaRecord(BaseModel):
    saga_id: str
    site: str
    state: SagaState = S.DETECTED
    reason: str | None = None
    created_at: float
    updated_at: float
    ups: dict[str, UpsView] = Field(default_factory=dict)
    at_risk: list[str] = Field(default_factory=list)
    jobs: dict[str, JobPlan] = Field(default_factory=dict)
    nodes: dict[str, NodePlan] = Field(default_factory=dict)  # nodes ever at risk in this saga
    deadline: float | None = None
    stop_reason: str | None = None  # why the saga decided to stop (a final checkpoint may come first)
    stop_decided_at: float | None = None
    ups_at_stop: dict[str, UpsView] = Field(default_factory=dict)  # the UPSes when the nodes were told to stop
    shutdown_reason: str | None = None
    shutdown_started_at: float | None = None
    power_back_at: float | None = None
    back_before_shutdown_at: float | None = None  # power returned before any shutdown: jobs must be heard since
    restore_started_at: float | None = None
    issued: set[str] = Field(default_factory=set)
    history: list[Transition] = Field(default_factory=list)
    trace_id: str = Field(default_factory=lambda: secrets.token_hex(16))
    root_span_id: str = Field(default_factory=lambda: secrets.token_hex(8))
    parent_span_id: str | None = None  # the span that published the first on_battery
    spans_done: set[str] = Field(default_factory=set)
    drill: bool = False  # started by `powerguard drill`: every power and job command is dry-run
    shutdown_need: dict[str, float] = Field(default_factory=dict)  # node group -> measured shutdown, s
    battery: dict[str, BatteryFigures] = Field(default_factory=dict)  # UPS -> its estimate against what happened
    carried: dict[str, JobPlan] = Field(default_factory=dict)  # jobs a superseded saga had yet to restart
    superseded_by: str | None = None
    ups_off: dict[str, UpsOffPlan] = Field(default_factory=dict)  # UPS -> its output told off and to return
    id_secret: str = Field(default_factory=lambda: secrets.token_hex(16))  # keys the event ids (outbox)

    @field_serializer("issued", "spans_done")
    def _sorted(self, value: set[str]) -> list[str]:
        """Sets as sorted lists: the same record always dumps to the same JSON (the core's
        change detection, the store's unchanged parts)."""
        return sorted(value)

    @property
    def terminal(self) -> bool:
        return self.state.terminal

    @property
    def on_battery(self) -> list[str]:
        return sorted(u for u, v in self.ups.items() if v.on_battery)

    @property
    def supply(self) -> Supply:
        """What the battery-budget rules read of this saga."""
        return Supply(self.ups, self.shutdown_need)

    def jobs_by_node(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = defaultdict(list)
        for name in sorted(self.jobs):
            for node in sorted(set(self.jobs[name].ranks.values())):
                out[node].append(name)
        return out

    def acks(self) -> tuple[int, int]:
        """(ranks acked, ranks expected) over every job."""
        return (sum(len(j.acked) for j in self.jobs.values()), sum(j.world_size for j in self.jobs.values()))
