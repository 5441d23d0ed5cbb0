"""Answers to checkpoint requests: ``ckpt.durable`` and ``ckpt.failed`` for every request a
checkpoint served, with the request and saga they answer and the rank that answers."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from powerguard.schemas import (
    CheckpointDurable,
    CheckpointDurableData,
    CheckpointFailed,
    CheckpointFailedData,
    CheckpointRequestData,
    Durations,
)

log = logging.getLogger("powerguard.ckpt_agent")


@dataclass
class Saved:
    """A durable checkpoint this rank took part in (what ``CheckpointAgent.save`` returns)."""

    path: str  # the step directory
    bytes: int  # bytes this rank wrote
    digest: str  # xxh3-128 of this rank's manifest
    write_s: float
    commit_s: float
    total_s: float
    agree_s: float = 0.0  # waiting for every rank to agree on the step (power-event saves)

    def durations(self) -> Durations:
        return Durations(agree_s=self.agree_s, write_s=self.write_s, commit_s=self.commit_s, total_s=self.total_s)


class _AckMixin:
    """Acks of :class:`CheckpointAgent` (mixed in; uses its bus thread, job and rank)."""

    def _ack_fields(self, r: CheckpointRequestData) -> dict[str, Any]:
        """What every ack of this rank to request ``r`` carries."""
        return {
            "request_id": r.request_id,
            "saga_id": r.saga_id,
            "job": self.job,
            "rank": self.rank,
            "world_size": self.world_size,
        }

    def _answer_durable(self, requests: list[CheckpointRequestData], step: int, info: Saved, ctx: Any = None) -> None:
        if self._bus is None or not requests:
            return
        self._bus.answer(
            requests,
            lambda r: CheckpointDurable(
                source=self._bus.source,
                data=CheckpointDurableData(
                    **self._ack_fields(r),
                    step=step,
                    tier="local",
                    path=info.path,
                    bytes=info.bytes,
                    digest=info.digest,
                    durations=info.durations(),
                ),
            ),
            ctx,
        )

    def _answer_failed(self, requests: list[CheckpointRequestData], exc: BaseException, ctx: Any = None) -> None:
        log.error("rank %d: checkpoint failed: %s", self.rank, exc)
        if self._bus is None or not requests:
            return
        self._bus.answer(
            requests,
            lambda r: CheckpointFailed(
                source=self._bus.source,
                data=CheckpointFailedData(
                    **self._ack_fields(r), step=self._step, error=str(exc), error_type=type(exc).__name__
                ),
            ),
            ctx,
        )
