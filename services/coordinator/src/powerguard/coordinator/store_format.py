"""The saga record's stored form (``pg_sagas``, through :mod:`.store`): the record's JSON,
kept small and stable (the same record always gives the same bytes, so the store rewrites
only the parts of a large record that changed): a job's ranks as runs, a node's plan without
its unset fields. The record's model (:mod:`.record`) knows nothing of it.
"""

from __future__ import annotations

from typing import Any

from .record import SagaRecord

JOB_TABLES = ("jobs", "carried")


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
    data = rec.model_dump(mode="json")
    for table in JOB_TABLES:
        for plan in data[table].values():
            plan["ranks"] = ranks_as_runs(plan["ranks"])
    # a 12,500-node saga starts with every node's plan empty: stored that way it is a quarter
    # of the bytes to write and split (every field but ``node`` defaults to None)
    data["nodes"] = {n: {k: v for k, v in p.items() if v is not None} for n, p in data["nodes"].items()}
    return data


def decode(data: dict[str, Any]) -> SagaRecord:
    """A stored record read back (also one written before runs)."""
    for table in JOB_TABLES:
        for plan in (data.get(table) or {}).values():
            plan["ranks"] = ranks_from_runs(plan.get("ranks", {}))
    return SagaRecord.model_validate(data)
