"""The saga record's stored form (``pg_sagas``, through :mod:`.store`): the record's JSON,
kept small and stable (the same record always gives the same bytes, so the store rewrites
only the parts of a large record that changed): a job's ranks as runs, a node's plan without
its unset fields. The record's model (:mod:`.record`) knows nothing of it.
"""

from __future__ import annotations

from typing import Any

from .record import CkptRound, JobPlan, SagaRecord

JOB_TABLES = ("jobs", "carried")
_RECORD_FIELDS = tuple(SagaRecord.model_fields)
_JOB_FIELDS = tuple(JobPlan.model_fields)
_ROUND_FIELDS = tuple(CkptRound.model_fields)
_PER_RANK = ("acked", "failed", "levels")  # a round's maps of rank -> scalar: copied, not dumped
_ROUNDS = ("final", "hold")  # a job's other rounds (the job is one itself)
_JOB_EXCLUDE = {"ranks": True, **dict.fromkeys(_PER_RANK, True), **{r: set(_PER_RANK) for r in _ROUNDS}}
_EXCLUDE = {"nodes": True, **{t: {"__all__": _JOB_EXCLUDE} for t in JOB_TABLES}}  # put back by the encoder


def ranks_as_runs(ranks: dict[Any, str]) -> list[list[int | str]]:
    """``[[first rank, count, node], ...]``: a node's ranks are usually consecutive, so a
    4,096-rank job is 512 runs instead of 4,096 entries (the largest part of a 100k-rank
    saga's first write). Any placement works: in the worst case a run per rank."""
    runs: list[list[int | str]] = []
    last: list | None = None
    for rank, node in sorted((int(r), n) for r, n in ranks.items()):
        if last is not None and last[2] == node and last[0] + last[1] == rank:
            last[1] += 1
        else:
            last = [rank, 1, node]
            runs.append(last)
    return runs


def ranks_from_runs(value: Any) -> Any:
    """Runs as stored, or the rank -> node map itself (records written before runs)."""
    if isinstance(value, list):
        return {first + i: node for first, count, node in value for i in range(count)}
    return value


def encode(rec: SagaRecord) -> dict[str, Any]:
    """The record as stored (JSON types only)."""
    return RecordEncoder().encode(rec)


def _with_ranks(dumped: dict, rnd: CkptRound, order: tuple[str, ...] = _ROUND_FIELDS) -> dict:
    """A round's dump with its per-rank maps put back as copies (rank keys stay ints: JSON makes
    them strings, as a dump would): a 100,000-rank outage's maps are copied in C, not dumped
    value by value on every save."""
    for field in _PER_RANK:
        dumped[field] = dict(getattr(rnd, field))
    return {k: dumped[k] for k in order}


class RecordEncoder:
    """Encodes one saga's record again and again (the store keeps one per saga), doing again
    only what changed: a job's runs are recomputed when its ranks changed, a node's plan dumped
    when its fields changed (each compared with a copy of what was encoded: C-level dict
    comparisons, no serialization), and an unchanged ``nodes`` table is the very object it
    returned last time, so the split (:mod:`.record_parts`) knows it by identity and writes
    nothing of it again. The result is the same as a fresh encoder's, byte for byte."""

    def __init__(self) -> None:
        self._runs: dict[tuple[str, str], tuple[dict, list]] = {}  # (table, job) -> (its ranks, their runs)
        self._nodes: dict[str, tuple[dict, dict]] = {}  # node -> (its plan's fields, their stored form)
        self._table: dict[str, dict] = {}  # the nodes table last returned

    def encode(self, rec: SagaRecord) -> dict[str, Any]:
        data = rec.model_dump(mode="json", exclude=_EXCLUDE)
        for table in JOB_TABLES:  # the fields in their order, as a whole dump gives them
            plans = getattr(rec, table)
            for name, dumped in data[table].items():
                plan = plans[name]
                dumped["ranks"] = self._ranks(table, name, plan.ranks)
                for field in _ROUNDS:
                    if dumped[field] is not None:
                        dumped[field] = _with_ranks(dumped[field], getattr(plan, field))
                data[table][name] = _with_ranks(dumped, plan, _JOB_FIELDS)
        data["nodes"] = self._nodes_table(rec)
        return {k: data[k] for k in _RECORD_FIELDS}

    def _ranks(self, table: str, job: str, ranks: dict) -> list:
        known = self._runs.get((table, job))
        if known is not None and known[0] == ranks:
            return known[1]
        runs = ranks_as_runs(ranks)
        self._runs[(table, job)] = (dict(ranks), runs)
        return runs

    def _nodes_table(self, rec: SagaRecord) -> dict[str, dict]:
        # a 12,500-node saga starts with every node's plan empty: stored that way it is a quarter
        # of the bytes to write and split (every field but ``node`` defaults to None)
        out: dict[str, dict] = {}
        changed = len(rec.nodes) != len(self._table)
        for name, plan in rec.nodes.items():
            fields = plan.__dict__
            known = self._nodes.get(name)
            if known is None or known[0] != fields:
                stored = {k: v for k, v in fields.items() if v is not None}  # JSON scalars as they are
                known = self._nodes[name] = (dict(fields), stored)
                changed = True
            out[name] = known[1]
        if not changed and list(out) == list(self._table):
            return self._table  # the same object: nothing in it is split or written again
        self._table = out
        return out


def decode(data: dict[str, Any]) -> SagaRecord:
    """A stored record read back (also one written before runs)."""
    for table in JOB_TABLES:
        for plan in (data.get(table) or {}).values():
            plan["ranks"] = ranks_from_runs(plan.get("ranks", {}))
    return SagaRecord.model_validate(data)
