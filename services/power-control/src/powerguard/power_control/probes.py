"""Readiness probes for a powered-on node: ``tcp://host:port`` or ``http(s)://...``."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

import aiohttp


async def probe_once(url: str, *, timeout_s: float) -> tuple[bool, str]:
    """(ready, what was seen). Never raises."""
    parts = urlsplit(url)
    try:
        if parts.scheme == "tcp":
            if not parts.hostname or not parts.port:
                return False, f"bad probe URL {url!r} (want tcp://host:port)"
            _, writer = await asyncio.wait_for(asyncio.open_connection(parts.hostname, parts.port), timeout_s)
            writer.close()
            return True, "port open"
        if parts.scheme in ("http", "https"):
            timeout = aiohttp.ClientTimeout(total=timeout_s)
            async with aiohttp.ClientSession(timeout=timeout) as s, s.get(url) as rsp:
                return 200 <= rsp.status < 300, f"HTTP {rsp.status}"
        return False, f"unsupported probe scheme in {url!r}"
    except (OSError, TimeoutError, aiohttp.ClientError) as exc:
        return False, f"{type(exc).__name__}: {exc}"
