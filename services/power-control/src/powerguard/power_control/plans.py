"""The shutdown and restore sequences as plans: pure functions of the command, the site and
the clock's ``now`` (nothing here sleeps, reads a device or the clock), executed step by
step by the runner (``sequences.Sequencer``).

A shutdown plan is one node's steps in order: stop its jobs, read the BMC, ACPI soft-off and
wait, hard off if still on, then the outlets (after the BMC, or instead of it on a retry of a
failed off). A restore plan is the power-on groups in order, each node with its outlets, what
switches it on (its BMC, or its outlet), its slot in the power-on ramp when every device
answers, and its deadline to be ready.

Every step has a bound: ``wait_s`` is how long the runner waits for the state the step asks
for, ``deadline`` the latest the step can end with every device call timing out and retried
(``device_timeout_s`` per request, ``retries`` with doubling ``retry_backoff_s``). A node's
steps follow one another (never two actions on one node at once); one node's steps never wait
on another node's, so a dead device delays only its own node (and, in a restore, the next
power-on group by at most its own bound).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from powerguard.schemas import NodeConfig

from .config import PowerControlSettings
from .ramp import Ramp

Action = Literal["job_stop", "status", "soft_off", "off", "outlet_off", "outlet_on", "on", "ready"]
When = Literal["always", "on", "still_on", "bmc_failed"]


def call_s(s: PowerControlSettings) -> float:
    """The longest one device call takes: every attempt times out, with the backoffs between."""
    return (s.retries + 1) * s.device_timeout_s + s.retry_backoff_s * (2**s.retries - 1)


def outlet_s(s: PowerControlSettings) -> float:
    """One outlet switched: its state read, the switch, the read-back."""
    return 3 * call_s(s)


@dataclass(frozen=True)
class Step:
    action: Action
    device: str  # scheduler:<kind> | bmc:<node> | pdu:<pdu>:<outlet> | probe
    deadline: float  # the latest this step ends (clock time), every call timing out
    wait_s: float = 0.0  # after its command: how long to wait for the state it asks for
    when: When = "always"  # always; "on": the BMC read the node on; "still_on": the soft-off left it on;
    # "bmc_failed": the BMC failed on a retry of the off (the outlets are the fallback)


@dataclass(frozen=True)
class ShutdownPlan:
    node: str
    steps: tuple[Step, ...]

    @property
    def deadline(self) -> float:
        return max((s.deadline for s in self.steps), default=0.0)


def shutdown_plan(
    node: NodeConfig,
    s: PowerControlSettings,
    *,
    now: float,
    jobs: Sequence[str],
    retry: int,
    bmc: str | None,
    scheduler: str,
    scheduler_s: float | None = None,
) -> ShutdownPlan:
    """The shutdown of ``node``: ``bmc`` names its BMC device (None: the node has none),
    ``jobs`` the jobs to stop first (each waited for as the saga's own stop first),
    ``retry`` > 0 on a shutdown commanded again after its off failed, ``scheduler_s`` the
    longest the scheduler's stop of those jobs takes (its adapter's own timeouts; at least one
    device call)."""
    call = call_s(s)
    stop = call if scheduler_s is None else max(call, scheduler_s)
    t = now + (s.job_stop_grace_s + s.job_stop_wait_s if jobs else 0.0) + stop
    steps = [Step("job_stop", f"scheduler:{scheduler}", t)]
    outlets = [f"pdu:{o.pdu}:{o.outlet}" for o in node.outlets]
    if bmc is not None:
        t += call
        steps.append(Step("status", bmc, t))
        t += call + s.soft_off_timeout_s
        steps.append(Step("soft_off", bmc, t, wait_s=s.soft_off_timeout_s, when="on"))
        t += call + s.device_timeout_s
        steps.append(Step("off", bmc, t, wait_s=s.device_timeout_s, when="still_on"))
        if retry and outlets:
            for device in outlets:
                t += outlet_s(s)
                steps.append(Step("outlet_off", device, t, when="bmc_failed"))
    if s.outlets_off_on_shutdown:
        for device in outlets:
            t += outlet_s(s)
            steps.append(Step("outlet_off", device, t))
    return ShutdownPlan(node.name, tuple(steps))


@dataclass(frozen=True)
class NodeRestore:
    node: str
    outlets: tuple[str, ...]  # pdu:<pdu>:<outlet>, switched on first
    switch: Literal["bmc", "outlet"]  # what powers it on: its BMC, or (no BMC) its outlet
    pdus: tuple[str, ...]  # the PDUs feeding it (ramp scopes)
    slot: float  # its power-on in the ramp when every device answers (``now`` without a ramp)
    deadline: float  # the latest it is ready (or reported failed), its group starting at the latest
    bound_s: float = 0.0  # its own devices' bound from its turn (its slot and its place in the power-on
    # window): outlets, the switch, the boot; the runner fails it past this (the waits for the ramp's
    # rates and the window are the other nodes' and are reported, not bounded)


@dataclass(frozen=True)
class GroupPlan:
    group: int  # power_on_group: lower groups first (storage, network before compute)
    nodes: tuple[NodeRestore, ...]  # sorted by name

    @property
    def deadline(self) -> float:
        return max(n.deadline for n in self.nodes)


@dataclass(frozen=True)
class RestorePlan:
    groups: tuple[GroupPlan, ...]

    def node(self, name: str) -> NodeRestore:
        return next(n for g in self.groups for n in g.nodes if n.node == name)


def restore_plan(
    nodes: Sequence[str],
    site: Mapping[str, NodeConfig],
    s: PowerControlSettings,
    *,
    now: float,
    bmcs: frozenset[str] | set[str],
    ramp: Ramp | None = None,
) -> RestorePlan:
    """The restore of ``nodes`` (each once; ``bmcs``: those with a BMC): groups in
    ``power_on_group`` order, each starting when the one before ended, at the latest at its
    deadline. Outlet-on actions of the site are ``outlet_stagger_s`` apart; the ramp's slots
    are spaced by its rates (ramp.py), planned from ``now`` in group and name order, after what
    ``ramp`` (the runner's live ramp: earlier restores' bookings) holds; it is not changed (the
    runner books the plan's slots)."""
    if s.ramp.enabled:
        ramp = ramp.copy() if ramp is not None else Ramp(s.ramp)
    else:
        ramp = None
    by_group: dict[int, list[str]] = {}
    for name in sorted(set(nodes)):
        by_group.setdefault(site[name].power_on_group, []).append(name)
    call, start = call_s(s), now
    stagger_at = now - s.outlet_stagger_s  # the last outlet-on (none yet)
    groups = []
    for group in sorted(by_group):
        members = []
        for name in by_group[group]:
            cfg = site[name]
            outlets = tuple(f"pdu:{o.pdu}:{o.outlet}" for o in cfg.outlets)
            pdus = tuple(o.pdu for o in cfg.outlets)
            for _ in outlets:
                stagger_at = max(start, stagger_at + s.outlet_stagger_s)
            slot = ramp.reserve(name, pdus, start) if ramp is not None else start
            own = len(outlets) * outlet_s(s) + (call if name in bmcs else 0.0)
            switched = max(slot, stagger_at) + own
            members.append(
                NodeRestore(
                    node=name,
                    outlets=outlets,
                    switch="bmc" if name in bmcs else "outlet",
                    pdus=pdus,
                    slot=slot,
                    deadline=switched + s.boot_timeout_s + s.batch_interval_s,
                    bound_s=own + s.boot_timeout_s + s.batch_interval_s,
                )
            )
        plan = GroupPlan(group, tuple(members))
        groups.append(plan)
        start = plan.deadline
    return RestorePlan(tuple(groups))
