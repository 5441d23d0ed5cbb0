"""Offline verification of a checkpoint directory (``python -m powerguard.ckpt_agent verify``)."""

from __future__ import annotations

from . import _layout as L


def verify_checkpoint(url: str, *, key: bytes | None = None) -> dict:
    """Check COMMIT, every manifest and every file of one checkpoint (local path or fsspec URL);
    with ``key`` (``_layout.load_key``) also its signature and keyed digests, first.

    Returns the COMMIT; raises :class:`~powerguard.ckpt_agent.CorruptCheckpoint` naming the problem."""
    fs, path = L.fs_for(url)
    commit = L.read_commit(fs, path)
    L.authenticate(commit, key, path)
    files = L.manifest_files(fs, path, commit, key)
    L.verify_files(fs, path, files, sorted(files), key)
    L.verify_metadata(fs, path, commit, key)
    return commit
