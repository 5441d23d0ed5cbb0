"""The battery-budget rules: how long the nodes at risk have on their feeds, what the shutdown
needs of the battery, low battery and FSD, the time a checkpoint may take now, and whether the
final checkpoint at the stop is taken. Pure functions of a :class:`Supply` (the UPS readings and
the measured shutdowns), the topology and the policy: a saga passes its own
(``SagaRecord.supply``), a drill or ``status`` one made of readings alone (:func:`outlook`).

**What a shutdown needs, from the first outage on.** A node group's shutdown needs at most what
the site's own timings allow it while its devices answer (``Topology.group_bound_s``: its jobs'
stop, the soft-off and its timeout, the hard off, the outlets), and never more than the
configured ``shutdown_reserve_s`` says; the shutdowns measured in earlier real outages (times
``shutdown_factor``) refine it. So a site's first outage budgets with what its own settings
bound, not with the reserve alone.

**The final checkpoint whenever it can still help** (:func:`final_window`). At the stop, a
``checkpoint-at-stop`` job's final checkpoint is taken when its cost (this outage's own power
checkpoint of that job) fits the budget. When it does not (the runtime jumped below what the
shutdown needs), it is still taken when ``final_ckpt_factor`` times its cost fits in
``final_margin_share`` of the runtime left: the shutdown then starts at most that share of the
runtime later, seconds of its margin spent against the certain loss of every step trained in
the hold. Under FSD, or with nothing measured and no budget, it is skipped.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from . import battery
from .policy import Policy
from .record import Supply, UpsView
from .topology import Topology


def ups_estimate(view: UpsView, capacity: tuple[float, float] | None = None) -> battery.Estimate:
    """One UPS's runtime: the most conservative of its own estimate, its discharge, its capacity."""
    return battery.estimate(
        reported_s=view.runtime_s,
        samples=view.samples if view.on_battery else (),
        charge_pct=view.charge_pct,
        load_pct=view.load_pct,
        capacity=capacity,
    )


def feeds_runtime(supply: Supply, feeds: tuple[str, ...], topo: Topology) -> float | None:
    """Runtime left for nodes on these feeds: their best feed (None when no feed reports one)."""
    ups = supply.ups
    known = [v for u in feeds if u in ups and (v := ups_estimate(ups[u], topo.capacity.get(u)).runtime_s) is not None]
    return max(known) if known else None


def runtime(supply: Supply, topo: Topology) -> float | None:
    """Runtime left for the nodes at risk: the worst node's best feed."""
    at_risk = topo.feed_sets_at_risk(supply.on_battery)
    known = [r for fs in at_risk if (r := feeds_runtime(supply, fs, topo)) is not None]
    return min(known) if known else None


def groups_need_s(supply: Supply, topo: Topology, policy: Policy, groups: Iterable[str]) -> float:
    """The slowest of these node groups' shutdowns: measured times ``shutdown_factor``, or
    ``shutdown_reserve_s`` for a group never measured, each at most what the site's own timings
    bound it by (and the reserve when there is no group)."""
    need = []
    for g in groups:
        measured = supply.shutdown_need.get(g)
        n = policy.shutdown_reserve_s if measured is None else measured * policy.shutdown_factor
        bound = topo.group_bound_s(g)
        need.append(n if bound is None else min(n, bound))
    return max(need) if need else policy.shutdown_reserve_s


def shutdown_need_s(supply: Supply, topo: Topology, policy: Policy) -> float:
    """What the shutdown of the nodes at risk needs of the battery (their groups' slowest)."""
    return groups_need_s(supply, topo, policy, {topo.group_key(fs) for fs in topo.feed_sets_at_risk(supply.on_battery)})


FSD = "forced shutdown (FSD)"


def low_battery(supply: Supply, topo: Topology) -> str | None:
    """Nodes at risk whose every feed reports low battery (or FSD)."""
    for feeds in topo.feed_sets_at_risk(supply.on_battery):
        views = [supply.ups[u] for u in feeds if u in supply.ups]
        if views and all(v.fsd for v in views):
            return FSD
        if views and all(v.low_battery or v.fsd for v in views):
            return "low battery"
    return None


def budget_s(supply: Supply, topo: Topology, policy: Policy) -> float:
    """Seconds a checkpoint may take now: min(ckpt_timeout_s, runtime - what the shutdown needs -
    margin_s); with low battery and no runtime reading, or FSD, there is no budget left."""
    left = runtime(supply, topo)
    budget = policy.ckpt_timeout_s
    if left is not None:
        budget = min(budget, left - shutdown_need_s(supply, topo, policy) - policy.margin_s)
    elif low_battery(supply, topo):
        budget = 0.0
    if low_battery(supply, topo) == FSD:
        budget = 0.0
    return max(0.0, budget)


@dataclass(frozen=True)
class FinalWindow:
    """Whether a job's final checkpoint is taken at the stop, and how long it may take."""

    seconds: float  # the final's deadline from now (0: skipped)
    why_skipped: str | None = None
    from_margin: bool = False  # taken within final_margin_share of the runtime, past the budget


def final_window(supply: Supply, topo: Topology, policy: Policy, cost_s: float | None) -> FinalWindow:
    """The final checkpoint of a job whose power checkpoint took ``cost_s`` in this outage."""
    budget = budget_s(supply, topo, policy)
    if low_battery(supply, topo) == FSD:
        return FinalWindow(0.0, FSD)
    if cost_s is None or cost_s <= budget:
        return FinalWindow(budget) if budget > 0 else FinalWindow(0.0, "no battery budget left")
    left = runtime(supply, topo)
    share = 0.0 if left is None else policy.final_margin_share * max(0.0, left - policy.margin_s)
    if policy.final_ckpt_factor * cost_s <= share:
        return FinalWindow(share, None, from_margin=True)
    need = shutdown_need_s(supply, topo, policy)
    return FinalWindow(
        0.0,
        f"the power checkpoint took {cost_s:.1f}s, {max(0.0, budget):.1f}s left before what the shutdown needs "
        f"({need:.0f}s), and {policy.final_ckpt_factor:g}x it is more than {policy.final_margin_share:.0%} of "
        f"the runtime left ({share:.1f}s)",
    )


@dataclass(frozen=True)
class Outlook:
    """What a saga would decide with some UPS readings, before any outage (drills, status)."""

    budget_s: float  # seconds a checkpoint requested now may take
    runtime_s: float | None  # runtime left for the nodes at risk (worst node's best feed)
    stop_at_runtime_s: float  # the saga stops the jobs when the runtime falls to this


def outlook(ups: dict[str, UpsView], topo: Topology, policy: Policy, *, checkpoint_s: float | None = None) -> Outlook:
    """The budget and stop point the saga's own rules give for these readings (feed sets,
    reserve, margin, low battery, FSD). ``checkpoint_s``: a measured checkpoint; with the
    ``checkpoint-at-stop`` policy the stop comes early enough for the final one."""
    supply = Supply(ups=dict(ups))
    stop_at = policy.shutdown_reserve_s
    if policy.hold_policy == "checkpoint-at-stop" and checkpoint_s is not None:
        stop_at = max(stop_at, policy.shutdown_reserve_s + policy.margin_s + policy.final_ckpt_factor * checkpoint_s)
    return Outlook(budget_s=budget_s(supply, topo, policy), runtime_s=runtime(supply, topo), stop_at_runtime_s=stop_at)
