"""The site's published status (``schemas/status.py``): each saga's :class:`SagaStatus`, built
from its record (:func:`status_of`, pure) and written to the ``pg_status`` bucket by
:class:`StatusBoard`. Tools read only that, never the record (``pg_sagas``, this service's
private storage)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from powerguard.bus import BusNames, Kv
from powerguard.bus.version import version
from powerguard.schemas import SagaStatus
from powerguard.schemas.status import RestoreProgress, SiteStatus

from . import budget as rules
from .figures import saga_figures
from .policy import Policy
from .record import SagaRecord
from .topology import Topology

log = logging.getLogger(__name__)

STATUS_EVERY_S = 1.0  # a saga whose state did not change is published at most this often


def _restore(rec: SagaRecord) -> RestoreProgress | None:
    """Nodes asked to power on, ready, and held back by the power-on ramp (None before the restore)."""
    asked = [p for p in rec.nodes.values() if p.power_on_at is not None]
    if not asked:
        return None
    waiting = [p for p in asked if p.ready_at is None and p.waiting]
    return RestoreProgress(
        asked=len(asked),
        ready=sum(p.ready_at is not None for p in asked),
        in_ramp=len(waiting),
        ramp=waiting[-1].waiting if waiting else None,
    )


def _ups_off(rec: SagaRecord) -> dict[str, str]:
    """The last step, per UPS told to cut its output and return: what it said."""
    out = {}
    for ups, t in sorted(rec.ups_off.items()):
        if t.error is not None:
            out[ups] = f"told to cut its output and return: FAILED ({t.error})"
        elif t.done_at is not None:
            at = t.told_at - rec.created_at
            out[ups] = (
                f"told at +{at:.0f}s (the UPS confirmed): output off {t.delay_s:.0f}s later, "
                f"on again with mains ({t.reason})"
            )
        else:
            out[ups] = f"told to cut its output and return, no answer yet ({t.reason})"
    return out


def status_of(rec: SagaRecord, *, now: float, policy: Policy | None = None, topo: Topology | None = None) -> SagaStatus:
    """What the coordinator publishes about a saga at ``now`` (the battery figures with the
    site's ``policy`` and ``topo``)."""
    acked, expected = rec.acks()
    battery = {}
    if policy is not None and topo is not None:
        took = [d for p in rec.jobs.values() if (d := p.duration_s) is not None]
        seen = rules.outlook(rec.ups, topo, policy, checkpoint_s=max(took) if took else None)
        battery = {
            "runtime_s": None if seen.runtime_s is None else round(seen.runtime_s, 1),
            "budget_s": round(rules.budget_s(rec.supply, topo, policy), 1),
            "stop_at_runtime_s": round(seen.stop_at_runtime_s, 1),
        }
    return SagaStatus(
        saga=rec.saga_id,
        site=rec.site,
        state=rec.state,
        drill=rec.drill,
        reason=rec.reason,
        published_at=now,
        started=rec.created_at,
        state_at=rec.history[-1].at if rec.history else rec.created_at,
        acks_received=acked,
        acks_expected=expected,
        deadline=rec.deadline if rec.state.checkpoint_deadline else None,
        ups_on_battery=rec.on_battery,
        nodes_at_risk=list(rec.at_risk),
        missing={j: p.missing for j, p in rec.jobs.items() if p.missing and p.settled_at is not None},
        restore=_restore(rec),
        ups_off=_ups_off(rec),
        trace_id=rec.trace_id,
        history=[{"state": h.state, "at": h.at, "reason": h.reason} for h in rec.history],
        shutdown_reserve_s=policy.shutdown_reserve_s if policy is not None else None,
        ckpt_timeout_s=policy.ckpt_timeout_s if policy is not None else None,
        **battery,
        **saga_figures(rec),
    )


class StatusBoard:
    """Publishes each changed saga's status: at once when its state changed (or it ended), else
    at most every ``every_s``; what was held back goes out at the next :meth:`flush`. A failed
    write is logged and tried again at the next flush: the status informs, it never blocks a
    decision."""

    def __init__(
        self,
        open_kv: Callable[[], Awaitable[Kv]],
        policy: Policy,
        topo: Topology,
        *,
        every_s: float = STATUS_EVERY_S,
    ) -> None:
        self.open_kv, self.policy, self.topo, self.every_s = open_kv, policy, topo, every_s
        self.kv: Kv | None = None
        self._dirty: dict[str, SagaRecord] = {}
        self._last: dict[str, tuple[float, str]] = {}  # saga -> (published at, state)
        self.failures = 0

    async def site(self, site: str, instance: str, now: float) -> None:
        """The site's status, published when this instance takes the lead (logged if it fails)."""
        status = SiteStatus(
            site=site,
            coordinator=instance,
            version=version("coordinator"),
            published_at=now,
            shutdown_reserve_s=self.policy.shutdown_reserve_s,
            ckpt_timeout_s=self.policy.ckpt_timeout_s,
            margin_s=self.policy.margin_s,
            hold_policy=self.policy.hold_policy,
            ups_alone={u: self.topo.nodes_at_risk([u]) for u in sorted(self.topo.ups)},
        )
        try:
            self.kv = self.kv or await self.open_kv()
            await self.kv.put(BusNames.site_status_key(site), status.model_dump_json(by_alias=True).encode())
        except Exception as exc:
            self.failures += 1
            log.error("site status not published: %s", exc)

    def changed(self, rec: SagaRecord) -> None:
        self._dirty[rec.saga_id] = rec

    async def flush(self, now: float) -> int:
        """Publish what is due; returns how many statuses were written."""
        wrote = 0
        if self._dirty and self.kv is None:
            try:
                self.kv = await self.open_kv()
            except Exception as exc:  # e.g. a release's new bucket not yet made: `powerguard bootstrap --update`
                self.failures += 1
                log.error("saga statuses not published: %s", exc)
                return 0
        assert self.kv is not None or not self._dirty
        for sid, rec in list(self._dirty.items()):
            at, state = self._last.get(sid, (None, None))
            if at is not None and state == rec.state.value and not rec.terminal and now - at < self.every_s:
                continue
            try:
                status = status_of(rec, now=now, policy=self.policy, topo=self.topo)
                await self.kv.put(  # type: ignore[union-attr]
                    BusNames.status_key(sid), status.model_dump_json(by_alias=True).encode()
                )
            except Exception as exc:
                self.failures += 1
                log.warning("saga %s: status not published (%s): trying again", sid, exc)
                continue
            del self._dirty[sid]
            wrote += 1
            if rec.terminal:
                self._last.pop(sid, None)
            else:
                self._last[sid] = (now, rec.state.value)
        return wrote
