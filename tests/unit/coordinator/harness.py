"""A small driver for the pure saga: a site, a registry of ranks, a clock."""

from __future__ import annotations

from dataclasses import dataclass, field

from powerguard.coordinator import saga
from powerguard.coordinator.inputs import Ack, Command, NodeReport, Power, Resumed, Tick
from powerguard.coordinator.policy import Policy
from powerguard.coordinator.record import SagaRecord, UpsView
from powerguard.coordinator.topology import AgentRegistry, Topology
from powerguard.schemas import AgentData

# n1, n2 on feed A; n3 on A+B; n4 on B
TOPO = Topology(site="dc1", feeds={"n1": ("A",), "n2": ("A",), "n3": ("A", "B"), "n4": ("B",)})
POLICY = Policy(
    ckpt_timeout_s=120,
    shutdown_reserve_s=60,
    margin_s=10,
    max_on_battery_s=900,
    restore_stable_s=30,
    min_restart_charge_pct=30,
    shutdown_timeout_s=300,
    restore_timeout_s=600,
    hold_policy="continue",  # the shutdown mechanics; test_hold_policy.py covers the other policies
)


def registry() -> AgentRegistry:
    reg = AgentRegistry()
    for rank, node in enumerate(["n1", "n1", "n2", "n2"]):
        reg.update(AgentData(job="j1", rank=rank, world_size=4, node=node, step=100))
    for rank in range(2):
        reg.update(AgentData(job="j2", rank=rank, world_size=2, node="n3", step=50))
    reg.update(AgentData(job="j3", rank=0, world_size=1, node="n4", step=7))
    return reg


@dataclass
class Drive:
    policy: Policy = POLICY
    topo: Topology = TOPO
    now: float = 1000.0
    reg: AgentRegistry = field(default_factory=registry)
    rec: SagaRecord | None = None
    commands: list[Command] = field(default_factory=list)
    ups: dict[str, UpsView] = field(default_factory=lambda: {"A": UpsView(), "B": UpsView()})

    def power(
        self,
        ups: str,
        on_battery: bool,
        runtime_s: float | None = 300.0,
        charge_pct: float = 90.0,
        low_battery: bool = False,
        fsd: bool = False,
    ) -> list[Command]:
        p = Power(
            ups=ups, on_battery=on_battery, runtime_s=runtime_s, charge_pct=charge_pct, low_battery=low_battery, fsd=fsd
        )
        view = self.ups[ups]
        if view.on_battery != on_battery:
            view.since = self.now
        view.on_battery, view.runtime_s, view.charge_pct = on_battery, runtime_s, charge_pct
        view.low_battery, view.fsd = low_battery and on_battery, fsd
        if self.rec is None:
            if not self.topo.nodes_at_risk([u for u, v in self.ups.items() if v.on_battery]):
                return []
            self.rec = saga.start(
                saga_id="s1",
                topo=self.topo,
                ups=self.ups,
                jobs=self.reg.jobs(),
                now=self.now,
                hold_policy=self.policy.hold_policy,
            )
            return self.send(Tick())
        return self.send(p)

    def ack(
        self,
        job: str,
        rank: int,
        *,
        ok: bool = True,
        request_id: str | None = "auto",
        step: int = 101,
        commit: str | None = None,
    ) -> list[Command]:
        rid = f"s1/{job}/ckpt" if request_id == "auto" else request_id
        error = None if ok else "disk full"
        return self.send(Ack(job=job, rank=rank, request_id=rid, step=step, ok=ok, error=error, commit=commit))

    def ack_all(self, job: str) -> list[Command]:
        out = []
        for r in range(self.rec.jobs[job].world_size):
            out += self.ack(job, r)
        return out

    def node(self, node: str, state: str, detail: str | None = None) -> list[Command]:
        return self.send(NodeReport(node=node, state=state, detail=detail))

    def resumed(self, job: str, step: int = 101) -> list[Command]:
        return self.send(Resumed(job=job, step=step))

    def advance(self, seconds: float) -> list[Command]:
        self.now += seconds
        return self.send(Tick())

    def send(self, inp) -> list[Command]:
        out = saga.handle(
            self.rec, inp, now=self.now, topo=self.topo, policy=self.policy, jobs=self.reg.jobs, ended=self.reg.ended
        )
        self.commands += out
        return out

    @property
    def state(self) -> str:
        return self.rec.state.value

    def kinds(self, cmds: list[Command]) -> list[tuple[str, str]]:
        return [(c.kind, c.target) for c in cmds]
