"""The checkpoint that answers power requests: one durable save of the agreed step for every
request the ranks gathered, acked ``durable`` (or ``failed`` with the reason) inside the
checkpoint's span; with a remote tier, a copy started if the requests' deadline allows it
(its acks raised to ``remote`` once copied); on the node-local tier the acks are raised to
``replicated:k`` once each node's files are on its peers. Returns what was saved."""

from __future__ import annotations

from typing import Any

from . import _spans
from ._acks import Acks, Saved
from ._agreement import Agreed
from ._saver import Saver
from .errors import CheckpointError


def power_checkpoint(got: Agreed, step: int, *, saver: Saver, acks: Acks, remote: Any) -> Saved | None:
    """Every rank: the checkpoint of ``step`` for ``got``'s requests; None when it failed (answered)."""
    try:
        try:
            info = saver.save(step, saga_id=got.saga_id)
        except CheckpointError as exc:
            _spans.failed(got.span, exc)
            acks.failed(got.requests, exc, step=step, ctx=_spans.inside(got.span))
            return None
        info.agree_s = got.agree_s
        got.span.set_attribute("powerguard.bytes", info.bytes)
        acks.durable(got.requests, step, info, ctx=_spans.inside(got.span))
        acks.expect_replicated(step, got.requests)  # raised to replicated:k when the node tier's copies land
    finally:
        got.span.end()
    if remote is not None:
        deadlines = [r.deadline.timestamp() for r in got.requests]
        acks.expect_remote(step, got.requests)  # raised to "remote" once copied
        if not remote.copy_if_time_allows(step, min(deadlines) if deadlines else None):
            acks.forget_remote(step)
    return info
