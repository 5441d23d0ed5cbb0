"""A checkpoint's keys: the site key, each job's key derived from it (or issued to the job alone:
``powerguard ckpt-key issue``), and the keyed BLAKE2b-256 digests they make. The COMMIT format
that uses them is ``_layout.py``."""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import CheckpointError, CorruptCheckpoint

JOB_KEY_HEADER = "powerguard-ckpt-job-key v1"
KEYED = "blake2b-256"


def keyed_hasher(key: bytes):
    return hashlib.blake2b(key=key, digest_size=32)


def keyed_digest(key: bytes, data: bytes) -> str:
    h = keyed_hasher(key)
    h.update(data)
    return h.hexdigest()


def load_key(path: str | os.PathLike) -> bytes:
    """The site's checkpoint key from a file (at least 16 bytes; any length, hashed to 64)."""
    raw = _read_key_file(path)
    if raw.startswith(JOB_KEY_HEADER.encode()):
        raise CheckpointError(f"checkpoint key {path}: a job's key, where the site key is needed")
    return _site_secret(raw, path)


def _read_key_file(path: str | os.PathLike) -> bytes:
    from powerguard.schemas.file_modes import warn_if_exposed

    warn_if_exposed(path, "checkpoint key", logging.getLogger("powerguard.ckpt_agent"))
    try:
        return Path(path).read_bytes().strip()
    except OSError as exc:
        raise CheckpointError(f"checkpoint key {path}: {exc.strerror}") from None


def _site_secret(raw: bytes, path) -> bytes:
    if len(raw) < 16:
        raise CheckpointError(f"checkpoint key {path}: {len(raw)} bytes, at least 16 are needed")
    return hashlib.sha512(raw).digest()  # BLAKE2b keys are at most 64 bytes


def job_key(site: bytes, job: str) -> bytes:
    """The key that signs ``job``'s checkpoints, derived from the site's (keyed BLAKE2b-512 of the
    job's name, personalised): whoever holds it signs for that job only."""
    return hashlib.blake2b(job.encode(), key=site, digest_size=64, person=b"pg-ckpt-job").digest()


def job_key_file_text(site: bytes, job: str) -> str:
    """What ``powerguard ckpt-key issue`` writes: the header, the job, the key in hex."""
    return f"{JOB_KEY_HEADER}\njob: {job}\nkey: {job_key(site, job).hex()}\n"


@dataclass(frozen=True)
class Keys:
    """A job's checkpoint keys: ``job`` signs and checks its checkpoints; ``site`` (None when the
    file held the job's own key) checks a format-1 checkpoint, signed before the binding."""

    job: bytes
    site: bytes | None = None

    def for_commit(self, commit: dict[str, Any], where: str) -> bytes:
        """The key that signed ``commit`` if it is this job's."""
        if int(commit.get("format", 1)) >= 2:
            return self.job
        if self.site is None:
            raise CorruptCheckpoint(
                f"{where}: signed with the site key before checkpoints named their job (format 1); this job "
                "holds only its own key: restore it once with the site key"
            )
        return self.site


def load_job_keys(path: str | os.PathLike, job: str) -> Keys:
    """The keys of ``job`` from a key file: a job key file issued for ``job`` (another job's is
    refused by name), or the site key (then derived; a warning says the container can sign for
    every job)."""
    raw = _read_key_file(path)
    if raw.startswith(JOB_KEY_HEADER.encode()):
        fields = dict(line.split(": ", 1) for line in raw.decode(errors="replace").splitlines()[1:] if ": " in line)
        if fields.get("job") != job:
            raise CheckpointError(f"checkpoint key {path} is job {fields.get('job')!r}'s, not {job!r}'s")
        try:
            key = bytes.fromhex(fields.get("key", ""))
        except ValueError:
            key = b""
        if len(key) != 64:
            raise CheckpointError(f"checkpoint key {path}: not a key `powerguard ckpt-key issue` wrote")
        return Keys(key)
    site = _site_secret(raw, path)
    logging.getLogger("powerguard.ckpt_agent").info(
        "checkpoint key %s is the site key: this job signs with its own key derived from it, but whoever "
        "reads the file can sign for every job (give each job its own: powerguard ckpt-key issue --job %s)",
        path,
        job,
    )
    return Keys(job_key(site, job), site)
