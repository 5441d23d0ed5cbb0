"""What the operator console shows, built from events, agent records and saga summaries (pure: no
I/O, an injected clock). :meth:`ConsoleState.snapshot` is the JSON the page renders."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

from powerguard.schemas import (
    AgentData,
    AgentHeartbeat,
    CheckpointDurable,
    CheckpointFailed,
    CheckpointRequested,
    CommLost,
    CommRestored,
    Envelope,
    JobResumed,
    NodeState,
    PowerActionDone,
    PowerActionFailed,
    PowerEvent,
    PowerStatus,
    SagaState,
    SagaStateChanged,
)

TIMELINE_MAX = 400  # events kept for the live timeline
TERMINAL = tuple(s.value for s in SagaState if s.terminal)
DEADLINE_STATES = tuple(s.value for s in SagaState if s.checkpoint_deadline)


def _describe(e: Envelope) -> str:
    """One line for the live timeline."""
    d = e.data
    if isinstance(e, PowerEvent):
        runtime = f", runtime {d.runtime_s:.0f} s" if d.runtime_s is not None else ""
        charge = f", charge {d.charge_pct:.0f} %" if d.charge_pct is not None else ""
        return f"UPS {d.ups}: {e.short_type}{charge}{runtime}" + (f" ({d.reason})" if d.reason else "")
    if isinstance(e, SagaStateChanged):
        return f"saga {d.state.value}" + (f": {d.reason}" if d.reason else "")
    if isinstance(e, CheckpointRequested):
        return f"checkpoint requested from job {d.job}" + (" (then pause)" if d.then == "pause" else "")
    if isinstance(e, CheckpointDurable):
        return f"job {d.job} {d.who()}: step {d.step} durable ({d.durability})"
    if isinstance(e, CheckpointFailed):
        return f"job {d.job} rank {d.rank}: checkpoint FAILED: {d.error}"
    if isinstance(e, PowerActionDone | PowerActionFailed):
        verb = "done" if isinstance(e, PowerActionDone) else f"FAILED: {d.error}"
        return f"node {d.node}: {d.action} {verb}"
    if isinstance(e, NodeState):
        return f"node {d.node}: {d.state}" + (f" ({d.detail})" if d.detail else "")
    if isinstance(e, JobResumed):
        return f"job {d.job} resumed" + (f" from step {d.step}" if d.step is not None else "")
    return e.short_type


class ConsoleState:
    """The site as the console sees it. ``reserve_s`` / ``budget_s``: the site's shutdown reserve
    and checkpoint budget (as its coordinator publishes them), shown against each UPS's runtime."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.time,
        reserve_s: float | None = None,
        budget_s: float | None = None,
        trace_url: str | None = None,
    ) -> None:
        self.clock = clock
        self.reserve_s, self.budget_s, self.trace_url = reserve_s, budget_s, trace_url
        self.ups: dict[str, dict[str, Any]] = {}
        self.nodes: dict[str, dict[str, Any]] = {}
        self.agents: dict[str, AgentData] = {}  # by KV key
        self.last_ckpt: dict[str, dict[str, Any]] = {}  # job -> last durable ack seen
        self.steps: dict[str, int] = {}  # job -> the newest step its heartbeats reported
        # what the events said of each saga since the last poll of its record: state, deadline, acks
        # (a phase shorter than the poll interval is still shown)
        self.live: dict[str, dict[str, Any]] = {}
        self.sagas: list[dict[str, Any]] = []
        self.timeline: deque[dict[str, Any]] = deque(maxlen=TIMELINE_MAX)
        self.bus_connected = False
        self.version = 0  # bumped on every change: the server pushes a snapshot when it moves

    def _changed(self) -> None:
        self.version += 1

    # ------------------------------------------------------------------ inputs
    def apply(self, e: Envelope) -> None:
        """One event from the bus."""
        now = self.clock()
        d = e.data
        if isinstance(e, PowerEvent) and d.drill:  # a drill's synthetic reading: beside the real one, marked
            u = self.ups.setdefault(d.ups, {"name": d.ups, "site": d.site})
            if d.on_battery and not isinstance(e, CommLost | CommRestored):
                u["drill"] = {
                    "on_battery": True,
                    "charge_pct": d.charge_pct,
                    "runtime_s": d.runtime_s,
                    "load_pct": d.load_pct,
                }
            else:  # the drill's mains back: the row shows the UPS's own word alone
                u.pop("drill", None)
            if isinstance(e, PowerStatus):
                self._changed()
                return
        elif isinstance(e, PowerEvent):
            u = self.ups.setdefault(d.ups, {"name": d.ups, "site": d.site})
            if isinstance(e, CommLost):
                u["comm_lost"] = True
            elif isinstance(e, CommRestored):
                u["comm_lost"] = False
            else:
                u.update(
                    on_battery=d.on_battery,
                    status=d.status,
                    charge_pct=d.charge_pct,
                    runtime_s=d.runtime_s,
                    load_pct=d.load_pct,
                    source=f"{d.driver or '?'}/{d.via or 'poll'}",
                    comm_lost=False,
                )
            u["reading_at"] = d.observed_at.timestamp()
            if isinstance(e, PowerStatus):  # periodic telemetry: the UPS panel, not a timeline entry
                self._changed()
                return
        elif isinstance(e, NodeState):
            n = self.nodes.setdefault(d.node, {"name": d.node})
            n.update(state=str(d.state), detail=d.detail, at=now, drill=self._drill(d.saga_id))
        elif isinstance(e, PowerActionDone | PowerActionFailed):
            n = self.nodes.setdefault(d.node, {"name": d.node})
            if d.power_state is not None:
                n["state"] = str(d.power_state)
                n["drill"] = self._drill(getattr(d, "saga_id", None))
            n.update(
                last_action=str(d.action), last_error=d.error if isinstance(e, PowerActionFailed) else None, at=now
            )
        elif isinstance(e, CheckpointDurable):
            self.last_ckpt[d.job] = {"step": d.step, "durability": d.durability, "at": e.time.timestamp()}
            if d.saga_id:
                self.live.setdefault(d.saga_id, {"acked": set()})["acked"].update((d.job, r) for r in d.speaks_for())
        elif isinstance(e, SagaStateChanged):
            live = self.live.setdefault(d.saga_id, {"acked": set()})
            live.update(
                drill=bool(getattr(d, "drill", False)),
                state=d.state.value,
                reason=d.reason,
                ups=d.ups,
                nodes=d.nodes,
                deadline_ts=d.deadline.timestamp() if d.deadline and d.state.value in DEADLINE_STATES else None,
                at=e.time.timestamp(),
                started=live.get("started", e.time.timestamp()),
            )
        elif isinstance(e, AgentHeartbeat):
            if d.step is not None:
                self.steps[d.job] = d.step if d.rank == 0 else max(self.steps.get(d.job, 0), d.step)
            self._changed()
            return  # heartbeats are not timeline entries
        self.timeline.append(
            {
                "at": e.time.timestamp(),
                "type": e.short_type,
                "saga": getattr(d, "saga_id", None),
                "drill": bool(getattr(d, "drill", False)) or self._drill(getattr(d, "saga_id", None)),
                "text": _describe(e),
                "bad": isinstance(e, CheckpointFailed | PowerActionFailed | CommLost),
            }
        )
        self._changed()

    def _drill(self, saga_id: str | None) -> bool:
        """Whether ``saga_id`` is a drill's (its state events say; the polled rows otherwise)."""
        if not saga_id:
            return False
        live = self.live.get(saga_id)
        if live is not None and "drill" in live:
            return bool(live["drill"])
        return any(bool(r.get("drill")) for r in self.sagas if r.get("saga") == saga_id)

    def set_agent(self, key: str, agent: AgentData | None) -> None:
        if agent is None:
            self.agents.pop(key, None)
        else:
            self.agents[key] = agent
        self._changed()

    def set_sagas(self, rows: list[dict[str, Any]]) -> None:
        """Saga summaries (``powerguard.coordinator.status.summarize``), newest first."""
        rows = sorted(rows, key=lambda r: r.get("started") or 0, reverse=True)
        for r in rows:
            if r.get("state") in TERMINAL:
                self.live.pop(r.get("saga"), None)
        if rows != self.sagas:
            self.sagas = rows
            self._changed()

    def set_connected(self, up: bool) -> None:
        if up != self.bus_connected:
            self.bus_connected = up
            self._changed()

    # ------------------------------------------------------------------ output
    def _jobs(self) -> list[dict[str, Any]]:
        jobs: dict[str, dict[str, Any]] = {}
        for a in self.agents.values():
            j = jobs.setdefault(
                a.job, {"name": a.job, "world_size": a.world_size, "ranks": 0, "nodes": set(), "step": None}
            )
            j["ranks"] += 1
            j["nodes"].add(a.node)
            if a.step is not None:
                j["step"] = max(j["step"] or 0, a.step)
            if a.paused_step is not None:
                j["paused_step"] = a.paused_step
        out = []
        for name in sorted(set(jobs) | set(self.last_ckpt)):
            j = jobs.get(name, {"name": name, "world_size": None, "ranks": 0, "nodes": set(), "step": None})
            ck = self.last_ckpt.get(name)
            if name in self.steps:
                j["step"] = self.steps[name]
            out.append(
                {
                    **j,
                    "nodes": sorted(j["nodes"]),
                    "last_checkpoint": None
                    if ck is None
                    else {**ck, "age_s": round(max(0.0, self.clock() - ck["at"]), 1)},
                }
            )
        return out

    def _nodes(self) -> list[dict[str, Any]]:
        names = set(self.nodes) | {a.node for a in self.agents.values()}
        for r in self.sagas[:1]:
            if r.get("state") not in TERMINAL:
                names |= set(r.get("nodes_at_risk") or [])
        out = []
        for n in sorted(names):
            info = dict(self.nodes.get(n, {"name": n}))
            info["jobs"] = sorted({a.job for a in self.agents.values() if a.node == n})
            out.append(info)
        return out

    def _merged(self) -> list[dict[str, Any]]:
        """The polled saga summaries with what events said since (newer: events arrive at once,
        the poll up to a second late); a saga only events know of yet comes first."""
        now = self.clock()
        rows = []
        for r in self.sagas:
            row = dict(r)
            budget = row.get("budget_left_s")
            row["deadline_ts"] = now + budget if budget is not None else None  # the page counts down to it
            live = self.live.get(row.get("saga"))
            if live and live.get("drill"):
                row["drill"] = True
            if live and "state" in live and live["at"] >= (row.get("state_at") or 0):  # the newer says
                row["state"] = live["state"]
                row["deadline_ts"] = live["deadline_ts"] if live["deadline_ts"] is not None else row["deadline_ts"]
                if live["state"] not in DEADLINE_STATES:
                    row["deadline_ts"] = None
            if live and live["acked"]:
                got, _, want = str(row.get("acks", "0/0")).partition("/")
                row["acks"] = f"{max(int(got or 0), len(live['acked']))}/{want}"
            rows.append(row)
        known = {r.get("saga") for r in rows}
        for sid, live in self.live.items():
            if sid not in known and live.get("state") not in (None, *TERMINAL):
                rows.insert(
                    0,
                    {
                        "saga": sid,
                        "drill": bool(live.get("drill")),
                        "state": live["state"],
                        "reason": live.get("reason"),
                        "acks": f"{len(live['acked'])}/?",
                        "ups_on_battery": live.get("ups") or [],
                        "nodes_at_risk": live.get("nodes") or [],
                        "jobs": {},
                        "missing": {},
                        "started": live.get("started"),
                        "deadline_ts": live.get("deadline_ts"),
                    },
                )
        return rows

    def snapshot(self) -> dict[str, Any]:
        now = self.clock()
        ups = []
        for u in sorted(self.ups.values(), key=lambda x: x["name"]):
            age = now - u["reading_at"] if "reading_at" in u else None
            ups.append({**u, "reading_age_s": None if age is None else round(max(0.0, age), 1)})
        rows = self._merged()
        open_saga = next((r for r in rows if r.get("state") not in TERMINAL), None)
        saga_events = (
            [t for t in self.timeline if t["saga"] in (None, open_saga["saga"])] if open_saga else list(self.timeline)
        )
        return {
            "now": now,
            "bus_connected": self.bus_connected,
            "drill": bool(open_saga and open_saga.get("drill")),  # the page says DRILL everywhere
            "reserve_s": self.reserve_s,
            "budget_s": self.budget_s,
            "trace_url": self.trace_url,
            "ups": ups,
            "nodes": self._nodes(),
            "jobs": self._jobs(),
            "saga": open_saga,
            "timeline": saga_events[-60:],
            "past": [r for r in rows if r is not open_saga][:50],
        }


def timeline_svg(row: dict[str, Any], history: list[dict[str, Any]]) -> str:
    """One saga's phases as a Gantt bar chart (SVG): ``history`` is the record's transitions
    (``{"state", "at", "reason"}``), in order."""
    if not history:
        return (
            '<svg xmlns="http://www.w3.org/2000/svg" width="600" height="30"><text x="4" y="20">no history</text></svg>'
        )
    t0 = history[0]["at"]
    end = max(h["at"] for h in history)
    span = max(end - t0, 1.0)
    width, left, row_h = 760, 150, 22
    colors = {
        "detected": "#f0ad4e",
        "checkpointing": "#5bc0de",
        "checkpointed": "#5bc0de",
        "holding": "#f7e08a",
        "final_checkpoint": "#5bc0de",
        "shutting_down": "#d9534f",
        "down": "#777",
        "partly_down": "#a94442",
        "restoring": "#5cb85c",
        "resumed": "#5cb85c",
    }
    bars = []
    for i, h in enumerate(history):
        start = h["at"]
        stop = history[i + 1]["at"] if i + 1 < len(history) else start
        x = left + (start - t0) / span * (width - left - 10)
        w = max(2.0, (stop - start) / span * (width - left - 10))
        y = 10 + i * row_h
        color = colors.get(h["state"], "#999")
        label = f"{h['state']} +{start - t0:.1f}s"
        bars.append(
            f'<text x="4" y="{y + 14}" font-size="12">{_esc(label)}</text>'
            f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="16" fill="{color}">'
            f"<title>{_esc(h.get('reason') or h['state'])}</title></rect>"
        )
    height = 20 + len(history) * row_h
    title = _esc(f"saga {row.get('saga', '')}")
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" aria-label="{title}">'
        + "".join(bars)
        + "</svg>"
    )


def _esc(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")
