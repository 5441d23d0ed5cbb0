"""The last step of an outage longer than the battery (pure): which UPS may now be told to cut
its output after a delay and turn it on again when mains returns, and why each other may not.

NUT ends a long outage this way ("killpower": ``shutdown.return`` once the hosts are down), so
every machine a UPS feeds boots into a known state when power comes back, instead of the
battery running flat under whatever is left. A UPS of a saga is *due* only when all hold, and
each one that is not says the first rule it fails:

1. the site allows it (``ups_off``: the UPSes, PDUs and BIOS/BMC restore policies are set up
   to come back by themselves; docs/reliability.md);
2. the command was not given in this saga already;
3. it is on battery now, by a real reading (mains back, or a drill: never);
4. every node it feeds *alone* (each of whose feeds is on battery: a node with a feed on mains
   keeps its power) was shut down by this saga and reported off without an error, and was not
   reported on again since (an operator powering a node on by hand during the outage) nor had
   a later off fail;
5. every rank of every job with a rank on those nodes has a durable checkpoint of this outage
   (its power or its final round complete);
6. it is time: its runtime left (the most conservative estimate, :mod:`.battery`) is at or
   below ``ups_off_runtime_s + ups_off_delay_s``, or the saga has been down ``ups_off_after_s``;
7. the site's other loads it alone feeds (``role`` in the site file) are down: once 1-6 hold,
   its storage nodes are shut down, then its network nodes (``Decision.shutdown``), and it is
   told only when all of them are off (the same rules as 4). Its management nodes
   (PowerGuard's own hosts) are shut down last, right after it is told (``UpsOff.management``):
   they go down within its delay, and power-control, which runs there, does not read them.

Nothing here sleeps or does I/O; ``now`` is the caller's clock. :func:`.saga.handle` calls it
while a saga is down (``ups_off`` commands; power-control's NUT driver carries them out).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from powerguard.schemas import SagaState, command_key

from . import battery
from .policy import Policy
from .record import SagaRecord
from .topology import Topology

ACTION = "output_off"


def target(ups: str) -> str:
    """The command's target: a UPS, apart from the nodes and jobs of the saga's keys."""
    return f"ups:{ups}"


@dataclass(frozen=True)
class UpsOff:
    ups: str
    key: str  # <saga>/ups:<name>/output_off: given once per saga
    delay_s: float
    reason: str
    nodes: tuple[str, ...] = ()  # what loses power with it (power-control reads each one first)
    management: tuple[str, ...] = ()  # PowerGuard's own hosts it alone feeds: shut down right after it is told


@dataclass(frozen=True)
class Decision:
    due: list[UpsOff] = field(default_factory=list)
    blocked: dict[str, str] = field(default_factory=dict)  # UPS -> why not now
    shutdown: list[str] = field(default_factory=list)  # storage/network nodes to shut down now (the last stage)


INFRA_ORDER = ("storage", "network")  # shut down in this order before their UPS is told


def fed_alone(ups: str, topo: Topology, on_battery: set[str]) -> list[str]:
    """The nodes that lose power when ``ups`` cuts its output: it feeds them and each of their
    other feeds is on battery too (one on mains keeps a node powered)."""
    return sorted(n for n, feeds in topo.feeds.items() if ups in feeds and set(feeds) <= on_battery | {ups})


def infra_fed_alone(ups: str, topo: Topology, on_battery: set[str], role: str) -> list[str]:
    """The site's ``role`` nodes (storage, network, management) that lose power with ``ups``."""
    return sorted(
        n for n, (r, feeds) in topo.infra.items() if r == role and ups in feeds and set(feeds) <= on_battery | {ups}
    )


def _not_off(rec: SagaRecord, node: str) -> str | None:
    """Why ``node`` cannot count as off in this saga (None: shut down by it and off)."""
    plan = rec.nodes.get(node)
    if plan is None or plan.shutdown_at is None:
        return f"{node}, which it alone feeds, was not shut down by this saga"
    if plan.off_at is None:
        return f"{node}, which it alone feeds, is not off yet"
    if plan.error is not None:
        return f"{node}, which it alone feeds, may still be on (its off failed: {plan.error})"
    if plan.in_doubt is not None:
        return f"{node}, which it alone feeds, may be on again: {plan.in_doubt}"
    return None


def _down_since(rec: SagaRecord) -> float | None:
    if rec.state != SagaState.DOWN:
        return None
    return next((t.at for t in reversed(rec.history) if t.state == SagaState.DOWN), None)


def decide(rec: SagaRecord, *, now: float, topo: Topology, policy: Policy) -> Decision:
    """Which UPSes that fed this saga's shut-down nodes are due to be told, and why the others are not."""
    fed = sorted({u for n, p in rec.nodes.items() if p.shutdown_at is not None for u in topo.feeds.get(n, ())})
    on_battery = {u for u, v in rec.ups.items() if v.on_battery}
    out = Decision()
    for ups in fed:
        when = None
        why = _blocked(rec, ups, topo=topo, policy=policy, on_battery=on_battery)
        if why is None:
            when = _due(rec, ups, now=now, topo=topo, policy=policy)
            why = "not yet: the battery lasts" if when is None else _loads(rec, ups, topo, on_battery, out.shutdown)
        if why is not None:
            out.blocked[ups] = why
            continue
        loads = [n for role in INFRA_ORDER for n in infra_fed_alone(ups, topo, on_battery, role)]
        out.due.append(
            UpsOff(
                ups=ups,
                key=command_key(rec.saga_id, target(ups), ACTION),
                delay_s=policy.ups_off_delay_s,
                reason=when or "",
                nodes=tuple(fed_alone(ups, topo, on_battery) + loads),
                management=tuple(infra_fed_alone(ups, topo, on_battery, "management")),
            )
        )
    return out


def _loads(rec: SagaRecord, ups: str, topo: Topology, on_battery: set[str], shutdown: list[str]) -> str | None:
    """Rule 7: the storage, then the network nodes it alone feeds, shut down and off before it is
    told; those to shut down now are added to ``shutdown``. None once all are off."""
    for role in INFRA_ORDER:
        nodes = infra_fed_alone(ups, topo, on_battery, role)
        start = [n for n in nodes if n not in rec.nodes or rec.nodes[n].shutdown_at is None]
        if start:
            shutdown.extend(n for n in start if n not in shutdown)
            return f"the last stage: shutting down its {role} first ({', '.join(start)})"
        for n in nodes:
            if why := _not_off(rec, n):
                return f"the last stage: {why}"
    return None


def _blocked(rec: SagaRecord, ups: str, *, topo: Topology, policy: Policy, on_battery: set[str]) -> str | None:
    """Rules 1-5: the first one ``ups`` fails (None: all hold)."""
    if not policy.ups_off:
        return "the site does not allow it (coordinator.ups_off: false)"
    if command_key(rec.saga_id, target(ups), ACTION) in rec.issued:
        return "already told in this saga"
    view = rec.ups.get(ups)
    if view is None or not view.on_battery:
        return "mains is back"
    if view.drill or rec.drill:
        return "a drill: a UPS's output is never cut"
    for node in fed_alone(ups, topo, on_battery):
        if why := _not_off(rec, node):
            return why
    nodes = set(fed_alone(ups, topo, on_battery))
    for name, plan in sorted(rec.jobs.items()):
        if set(plan.ranks.values()) & nodes and plan.durable_step is None:
            return f"job {name} has ranks without a durable checkpoint of this outage"
    return None


def _due(rec: SagaRecord, ups: str, *, now: float, topo: Topology, policy: Policy) -> str | None:
    view = rec.ups[ups]
    runtime = battery.estimate(
        reported_s=view.runtime_s,
        samples=view.samples,
        charge_pct=view.charge_pct,
        load_pct=view.load_pct,
        capacity=topo.capacity.get(ups),
    ).runtime_s
    threshold = policy.ups_off_runtime_s + policy.ups_off_delay_s
    if runtime is not None and runtime <= threshold:
        return f"runtime {runtime:.0f}s at or below {threshold:.0f}s (ups_off_runtime_s + ups_off_delay_s)"
    since = _down_since(rec)
    if policy.ups_off_after_s is not None and since is not None and now - since >= policy.ups_off_after_s:
        return f"down on battery for {now - since:.0f}s (ups_off_after_s)"
    return None
