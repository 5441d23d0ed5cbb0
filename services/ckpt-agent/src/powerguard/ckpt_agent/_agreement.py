"""The step agreement: at an agreement boundary the ranks all-reduce what each wants (a
request pending, a periodic save due, one still writing, one to commit, and the gap to the
next agreement), so every rank acts on the same decision at the same step.

Pipelined (the default), the all-reduce started at one agreement boundary is read at the
next: it runs while the ranks train. The caller says what this rank wants
(:class:`Wants`) and gets a :class:`Decision` back; :func:`agreed` gathers the requests
the ranks agreed to checkpoint, with the span of that checkpoint.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from powerguard.schemas import CheckpointRequestData

from . import _spans
from ._ranks import Ranks
from .errors import StepAgreementTimeout

MAX_AGREEMENT_GAP = 10_000  # boundaries between two agreements at most, whatever the step time
AGREE_FLOOR_S = 10.0  # the others reach a step boundary within a step: wait at least this long


@dataclass(frozen=True)
class Wants:
    """What this rank wants at a boundary."""

    pending: Any  # the request this rank has pending (``_bus.Request``) or None
    periodic: bool  # a periodic save is due (rank 0's clock)
    busy: bool  # a periodic save is still writing
    unfinished: bool  # a periodic save waits to be committed


@dataclass(frozen=True)
class Decision:
    """What every rank agreed, the same on every rank."""

    request: bool
    periodic: bool
    busy: bool
    unfinished: bool


class StepAgreementFailed(StepAgreementTimeout):
    """Not every rank reached the boundary; ``request`` is the request the agreement was for."""

    def __init__(self, message: str, request: Any) -> None:
        super().__init__(message)
        self.request = request


class StepAgreement:
    def __init__(
        self,
        ranks: Ranks,
        *,
        pipelined: bool,
        sync_every_n_steps: int,
        agree_every_s: float,
        agree_timeout_s: float,
    ) -> None:
        self.ranks = ranks
        self.pipelined = pipelined
        self.sync_every_n_steps = sync_every_n_steps
        self.agree_every_s = agree_every_s
        self.agree_timeout_s = agree_timeout_s
        self.boundaries = 0
        self.agreements = 0
        self._next = 1  # the boundary of the next agreement
        self._gap = sync_every_n_steps  # boundaries between agreements, as last agreed
        self._boundary_t: float | None = None  # when the last boundary was reached
        self._step_s: float | None = None  # a step's duration (moving average), for the proposed gap
        # the agreement started at the last boundary, read at the next: (work, flags, pending request)
        self._inflight: tuple[Any, torch.Tensor, Any] | None = None

    def boundary(self, now: float) -> bool:
        """Count a step boundary; True when the ranks agree at this one."""
        self.boundaries += 1
        if self._boundary_t is not None:
            took = now - self._boundary_t
            self._step_s = took if self._step_s is None else 0.8 * self._step_s + 0.2 * took
        self._boundary_t = now
        return self.boundaries >= self._next

    def scheduled(self) -> None:
        """The agreement at this boundary is over (or failed): the next one is a gap later."""
        self._next = self.boundaries + self._gap

    def agree(self, wants: Wants) -> Decision | None:
        """The decision to act on at this boundary (None: the first pipelined one, nothing agreed
        yet). Raises :class:`StepAgreementFailed` when a rank does not come in time: a request
        bounds the wait, never below ``AGREE_FLOOR_S`` (a deadline that passed means "now")."""
        self.agreements += 1
        if not self.ranks.distributed:  # one rank: what it sees is what all agree on
            return self._decided(self._flags(wants))
        if not self.pipelined:  # agree and act at this very boundary (benchmarks compare the two)
            self._start(wants)
        prev, self._inflight = self._inflight, None
        if prev is None:
            return None
        work, flags, pending = prev
        timeout = max(AGREE_FLOOR_S, pending.deadline_ts - time.time()) if pending else self.agree_timeout_s
        try:
            self.ranks.wait(work, timeout)
        except StepAgreementTimeout as exc:
            raise StepAgreementFailed(str(exc), pending) from None
        return self._decided(flags)

    def start(self, wants: Wants) -> None:
        """Pipelined: start the agreement the next agreement boundary reads (after acting)."""
        if self.ranks.distributed and self.pipelined:
            self._start(wants)

    def finish(self, timeout_s: float) -> bool:
        """At close: wait for the agreement still running; False when a peer stopped first."""
        if self._inflight is None:
            return True
        work, self._inflight = self._inflight[0], None
        try:
            self.ranks.wait(work, timeout_s)
        except StepAgreementTimeout:
            return False
        return True

    def _start(self, wants: Wants) -> None:
        flags = self._flags(wants)
        self._inflight = (self.ranks.start_max(flags), flags, wants.pending)

    def _proposed_gap(self) -> int:
        """Boundaries until the next agreement this rank proposes: about ``agree_every_s`` of steps."""
        if self.agree_every_s <= 0 or not self._step_s:
            return self.sync_every_n_steps
        return max(self.sync_every_n_steps, min(MAX_AGREEMENT_GAP, int(self.agree_every_s / self._step_s)))

    def _flags(self, w: Wants) -> torch.Tensor:
        """The wants as flags and, negated (the all-reduce takes the maximum: this gives the
        minimum), the gap to the next agreement."""
        return torch.tensor(
            [1 if w.pending else 0, int(w.periodic), int(w.busy), int(w.unfinished), -self._proposed_gap()],
            dtype=torch.int64,
        )

    def _decided(self, flags: torch.Tensor) -> Decision:
        values = flags.tolist()
        self._gap = -values[4]  # every rank read the same: the next agreement at the same boundary
        return Decision(*(bool(x) for x in values[:4]))


@dataclass
class Agreed:
    """The requests one checkpoint serves (every rank's pending one), and its span."""

    requests: list[CheckpointRequestData]
    span: Any
    first_seen: float  # when this rank first saw one
    at: float  # when the ranks agreed

    @property
    def agree_s(self) -> float:
        return max(0.0, self.at - self.first_seen)

    @property
    def saga_id(self) -> str | None:
        return next((r.saga_id for r in self.requests if r.saga_id), None)


def agreed(ranks: Ranks, step: int, pending: Any, *, job: str, framework: str | None) -> Agreed | None:
    """Every rank's pending request, gathered (one checkpoint serves them all), and the span of
    that checkpoint; None when every rank has answered them since (pipelined agreement)."""
    t_agree = time.time()
    gathered = ranks.gather([(pending.data, pending.traceparent)] if pending else [])
    requests = {data.request_id: data for rs in gathered for data, _ in rs}
    if not requests:
        return None
    first_seen = pending.received if pending else t_agree
    span = _spans.start(
        f"checkpoint {job}",
        _spans.parent(tp for rs in gathered for _, tp in rs),
        first_seen,
        **{
            "powerguard.job": job,
            "powerguard.rank": ranks.rank,
            "powerguard.world_size": ranks.world_size,
            "powerguard.step": step,
            "powerguard.framework": framework,
            "powerguard.saga_id": next(iter(requests.values())).saga_id,
        },
    )
    return Agreed(list(requests.values()), span, first_seen, t_agree)
