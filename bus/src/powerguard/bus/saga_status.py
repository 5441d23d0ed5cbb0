"""Reading the site's published status (``schemas/status.py``): what the console,
``powerguard status`` and the drill know of the coordinator's sagas. Never the coordinator's
own records: those are its storage."""

from __future__ import annotations

import logging
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from powerguard.schemas import SagaStatus
from powerguard.schemas.status import SiteStatus

from .client import Bus
from .names import BusNames

log = logging.getLogger(__name__)
T = TypeVar("T", bound=BaseModel)


def _parse(model: type[T], key: str, value: bytes) -> T | None:
    """One status as stored; None (logged) for a value no version of the schema reads."""
    try:
        return model.model_validate_json(value)
    except ValidationError as exc:
        log.warning("status %s unreadable: %s", key, exc.errors()[0].get("msg", exc))
        return None


def parse(key: str, value: bytes) -> SagaStatus | None:
    return _parse(SagaStatus, key, value)


def parse_site(key: str, value: bytes) -> SiteStatus | None:
    return _parse(SiteStatus, key, value)


async def site_status(bus: Bus, site: str) -> SiteStatus | None:
    """The site's status as its leading coordinator last published it (None: none yet)."""
    kv = await bus.status_board()
    entry = await kv.get(BusNames.site_status_key(site))
    if entry is None or not entry.value:
        return None
    return parse_site(BusNames.site_status_key(site), entry.value)


async def saga_status(bus: Bus, saga_id: str) -> SagaStatus | None:
    """One saga's newest published status (None: none yet)."""
    kv = await bus.status_board()
    key = BusNames.status_key(saga_id)
    entry = await kv.get(key)
    return parse(key, entry.value) if entry is not None and entry.value else None


async def saga_statuses(bus: Bus, *, include_closed: bool = False, site: str | None = None) -> list[SagaStatus]:
    """Every saga's newest published status (only the open ones unless ``include_closed``),
    oldest first."""
    kv = await bus.status_board()
    out = []
    for key in await kv.keys():
        if not key.startswith("saga."):
            continue
        entry = await kv.get(key)
        if entry is None or not entry.value:
            continue
        status = parse(key, entry.value)
        if status is None or (status.terminal and not include_closed) or (site and status.site != site):
            continue
        out.append(status)
    return sorted(out, key=lambda s: (s.started, s.saga))
