"""Who else on a host can read a secret file: a credential, a key, a backup of them. PowerGuard
writes every such file 0600 in a 0700 directory; a file it reads is checked the first time it
is read (:func:`warn_if_exposed`) and a wider mode is a warning that names the fix. Group read
stays allowed: the deployment guide gives the services' group its secrets (0640, group
``powerguard``)."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

_warned: set[str] = set()


def exposure(path: str | os.PathLike, what: str = "secret") -> str | None:
    """Why ``path`` (a file holding a ``what``) is readable or writable by more than its owner
    and group, or None when it is not (or does not exist: reading it will say so)."""
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return None
    if mode & 0o007:
        who = "read" if mode & 0o004 else "used"
        return f"{path} ({what}) is mode {mode:04o}: every user of this host can {who} it; chmod 600 {path}"
    if mode & 0o020:
        return f"{path} ({what}) is mode {mode:04o}: its group can change it; chmod 600 {path}"
    return None


def warn_if_exposed(path: str | os.PathLike, what: str, log: logging.Logger) -> str | None:
    """Log :func:`exposure`'s warning once per path and process; return it."""
    problem = exposure(path, what)
    key = str(Path(path).absolute())
    if problem and key not in _warned:
        _warned.add(key)
        log.warning("%s", problem)
    return problem


def write_private(path: str | os.PathLike, data: bytes) -> None:
    """Write a secret durably: 0600 from its first byte (never briefly wider), fsynced, then
    renamed over ``path``; its directory made 0700 when it is new."""
    path = Path(path)
    if not path.parent.exists():
        path.parent.mkdir(parents=True, mode=0o700)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # an old temporary file keeps its mode through O_CREAT
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
