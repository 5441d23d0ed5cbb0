"""When and on which code a benchmark's figures were measured: every results file carries it,
and docs/performance.md shows it beside each figure's source."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def stamp(result: dict) -> dict:
    """``result`` with ``measured_at`` (UTC) and ``commit`` (the checkout's HEAD, ``+changes``
    when the working tree differed from it)."""
    head = _git("rev-parse", "--short=10", "HEAD") or "unknown"
    dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
    return {
        **result,
        "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": head + ("+changes" if dirty else ""),
    }


def provenance(path: Path, result: dict | None) -> tuple[str, str]:
    """(when, commit) of a results file: its own stamp, else the commit that last wrote it."""
    if result and result.get("measured_at"):
        return result["measured_at"], result.get("commit", "?")
    log = _git("log", "-1", "--format=%cs %h", "--", str(path.relative_to(ROOT)))
    if not log:
        return "not committed", "-"
    day, commit = log.split()
    return f"{day} (committed)", commit


def write(result: dict, out: Path) -> None:
    """``result``, stamped (:func:`stamp`), as the results file ``out``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(stamp(result), indent=2) + "\n")
    print(f"wrote {out}")
