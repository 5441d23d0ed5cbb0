"""Offline verification of a checkpoint directory (``python -m powerguard.ckpt_agent verify``)."""

from __future__ import annotations

from . import _layout as L


def verify_checkpoint(url: str) -> dict:
    """Check COMMIT, every manifest and every file of one checkpoint (local path or fsspec URL).

    Returns the COMMIT; raises :class:`~powerguard.ckpt_agent.CorruptCheckpoint` naming the problem."""
    fs, path = L.fs_for(url)
    commit = L.read_commit(fs, path)
    files = L.manifest_files(fs, path, commit)
    L.verify_files(fs, path, files, sorted(files))
    with fs.open(f"{path}/.metadata", "rb") as f:
        if L.digest_bytes(f.read()) != commit["metadata_xxh3"]:
            raise L.CorruptCheckpoint(f"{path}/.metadata: checksum mismatch")
    return commit
