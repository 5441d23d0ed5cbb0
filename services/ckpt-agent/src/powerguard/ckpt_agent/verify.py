"""Offline verification of a checkpoint directory (``python -m powerguard.ckpt_agent verify``)."""

from __future__ import annotations

import re

from . import _keys as K
from . import _layout as L

_STEP_DIR = re.compile(r"^step-(\d+)$")


def placed(url: str) -> tuple[str | None, int | None]:
    """The job and step a checkpoint's place names (``<root>/<job>/step-<N>``; None: not so named)."""
    parts = url.rstrip("/").rsplit("/", 2)
    m = _STEP_DIR.match(parts[-1]) if parts else None
    if not m or len(parts) < 2:
        return None, None
    return parts[-2] or None, int(m.group(1))


def verify_checkpoint(url: str, *, key: bytes | None = None, keys: K.Keys | None = None) -> dict:
    """Check COMMIT, every manifest and every file of one checkpoint (local path or fsspec URL);
    with a key also its signature and keyed digests, first: ``keys`` (the job's,
    ``_keys.load_job_keys``) or the site's ``key`` (``_keys.load_key``; the job's key is
    derived from it for the job the directory's place names). A COMMIT written for another job or
    step than its place names is refused by name.

    Returns the COMMIT; raises :class:`~powerguard.ckpt_agent.CorruptCheckpoint` naming the problem."""
    fs, path = L.fs_for(url)
    job, step = placed(path)
    commit = L.read_commit(fs, path)
    if keys is None and key is not None:
        keys = K.Keys(K.job_key(key, job or ""), key)
    L.check_binding(commit, job=job, step=step, tier=None, where=path)
    signing = keys.for_commit(commit, path) if keys is not None else None
    L.authenticate(commit, signing, path)
    files = L.manifest_files(fs, path, commit, signing)
    L.verify_files(fs, path, files, sorted(files), signing)
    L.verify_metadata(fs, path, commit, signing)
    return commit
