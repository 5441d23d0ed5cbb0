"""The remote tier on S3 (``remote_url="s3://bucket/prefix"``), with S3's own guarantees and
nothing a file system would give (no fsync, no rename, no atomic multi-object write):

* every object goes up with a checksum S3 verifies before it stores it (``checksum``: CRC32 by
  default; a wrong one is refused, BadDigest), large ones as parallel multipart uploads, which
  S3 shows only once completed; each carries the manifest's xxh3 as metadata;
* before the commit every object is read back by HEAD: its size and xxh3 against the manifest
  (the data files), against COMMIT (the manifests, ``.metadata``);
* ``COMMIT`` is written create-only (``If-None-Match: *``): a PUT that returned 200 is durable,
  and it is the only object a reader trusts; a second writer of a step's COMMIT is refused
  (412) unless it holds the same checkpoint. No rename, no mutable ``LATEST``: the newest step
  with a COMMIT is the newest checkpoint;
* incomplete multipart uploads of uncommitted steps are aborted when the copier starts (an
  upload cut by a power cut or a kill costs storage until then, never a wrong restore);
* retention deletes whole steps, COMMIT first (a step half-deleted is uncommitted, never read);
* a restore downloads a committed step in parallel (S3 checks each object's checksum as it
  comes) into a staging directory, then verifies and loads it as any local tier.

Credentials come from boto3's standard places (environment, AWS config and profile, instance
roles) or two secret files; they are never logged. boto3 because it is AWS's own SDK: conditional
writes, checksums and multipart transfers as S3 defines them, maintained with the service.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlparse

import xxhash
from pydantic import BaseModel, ConfigDict, Field

from . import _layout as L
from .errors import CheckpointError, CorruptCheckpoint

log = logging.getLogger("powerguard.ckpt_agent.s3")
MB = 1024 * 1024
_STEP = re.compile(r"/step-(\d+)/")


class RemoteSettings(BaseModel):
    """The remote tier's S3 settings (the agent's ``remote_options``; the site file's
    ``ckpt_agent.remote``). Unset: boto3's own (``AWS_ENDPOINT_URL``, ``AWS_REGION``, ...)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    endpoint_url: str | None = Field(default=None, description="An on-prem S3 (Ceph RGW, MinIO, SeaweedFS); None: AWS")
    region: str | None = Field(default=None, description="The bucket's region (None: boto3's default)")
    addressing_style: Literal["auto", "path", "virtual"] = Field(
        default="auto", description="path: http://host/bucket/key (most on-prem servers)"
    )
    checksum: Literal["CRC32", "SHA256", "CRC32C", "CRC64NVME"] = Field(
        default="CRC32", description="What S3 verifies on every upload (CRC32C and CRC64NVME need awscrt)"
    )
    concurrency: int = Field(default=8, ge=1, le=64, description="Objects (and parts) in flight at once")
    part_size_mb: int = Field(default=64, ge=5, le=5120, description="Multipart part size (and threshold)")
    profile: str | None = Field(default=None, description="An AWS config profile")
    access_key_id_file: str | None = Field(default=None, description="A file holding the access key id")
    secret_access_key_file: str | None = Field(default=None, description="A file holding the secret key")


class AgentSection(BaseModel):
    """The site file's ``ckpt_agent`` section: what a site gives its jobs for the remote tier
    (``remote.url`` and the S3 settings; a job passes them as ``remote_url`` / ``remote_options``
    or ``POWERGUARD_REMOTE_OPTIONS``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    class Remote(RemoteSettings):
        url: str | None = Field(default=None, description="s3://bucket/prefix, or an fsspec URL (file:///nas/ckpt)")

    remote: Remote = Field(default_factory=Remote)


class CommitConflict(CheckpointError):
    """Another writer committed this step of the job with other contents."""


def is_s3(url: str | None) -> bool:
    return bool(url) and url.startswith("s3://")  # type: ignore[union-attr]


class S3Store:
    """One job's steps under ``s3://bucket/prefix/<job>/step-<N>/``."""

    def __init__(self, url: str, settings: RemoteSettings | None = None) -> None:
        try:
            import boto3
            from boto3.s3.transfer import TransferConfig
            from botocore.config import Config
        except ImportError:
            raise CheckpointError(
                f"remote_url {url}: the S3 tier needs boto3: pip install 'powerguard-ckpt-agent[s3]'"
            ) from None

        parsed = urlparse(url)
        if parsed.scheme != "s3" or not parsed.netloc:
            raise ValueError(f"remote_url {url!r}: an S3 URL is s3://bucket[/prefix]")
        self.url, self.bucket, self.prefix = url.rstrip("/"), parsed.netloc, parsed.path.strip("/")
        self.s = settings or RemoteSettings()
        creds: dict[str, str] = {}
        if self.s.access_key_id_file or self.s.secret_access_key_file:
            if not (self.s.access_key_id_file and self.s.secret_access_key_file):
                raise ValueError("remote_options: give both access_key_id_file and secret_access_key_file")
            creds = {
                "aws_access_key_id": _secret(self.s.access_key_id_file),
                "aws_secret_access_key": _secret(self.s.secret_access_key_file),
            }
        session = boto3.session.Session(profile_name=self.s.profile, **creds)
        self.client = session.client(
            "s3",
            endpoint_url=self.s.endpoint_url,
            region_name=self.s.region,
            config=Config(
                s3={"addressing_style": self.s.addressing_style},
                retries={"max_attempts": 8, "mode": "standard"},
                max_pool_connections=2 * self.s.concurrency,
                request_checksum_calculation="when_required",  # ours, named per request
                response_checksum_validation="when_supported",
                connect_timeout=10,
                read_timeout=60,
            ),
        )
        part = self.s.part_size_mb * MB
        self.transfer = TransferConfig(
            multipart_threshold=part, multipart_chunksize=part, max_concurrency=self.s.concurrency, use_threads=True
        )

    # -------------------------------------------------------------- names
    def _root(self, job: str) -> str:
        return f"{self.prefix}/{job}/" if self.prefix else f"{job}/"

    def key(self, job: str, step: int, name: str) -> str:
        return f"{self._root(job)}step-{step}/{name}"

    def where(self, job: str, step: int) -> str:
        return f"s3://{self.bucket}/{self._root(job)}step-{step}"

    # -------------------------------------------------------------- reads
    def _objects(self, prefix: str) -> Iterable[dict[str, Any]]:
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        for page in pages:
            yield from page.get("Contents", [])

    def steps(self, job: str) -> dict[int, bool]:
        """Every step with an object under it -> whether it has its COMMIT."""
        out: dict[int, bool] = {}
        for obj in self._objects(self._root(job)):
            m = _STEP.search("/" + obj["Key"].removeprefix(self._root(job)))
            if m:
                step = int(m.group(1))
                out[step] = out.get(step, False) or obj["Key"].endswith(f"/{L.COMMIT}")
        return dict(sorted(out.items(), reverse=True))

    def commit(self, job: str, step: int) -> dict[str, Any] | None:
        from botocore.exceptions import ClientError

        try:
            got = self.client.get_object(Bucket=self.bucket, Key=self.key(job, step, L.COMMIT), ChecksumMode="ENABLED")
        except ClientError as exc:
            if exc.response["Error"]["Code"] in ("NoSuchKey", "404"):
                return None
            raise
        return json.loads(got["Body"].read())

    # -------------------------------------------------------------- the copy
    def upload(self, src: str, job: str, step: int, commit: bytes) -> int:
        """Copy the committed local checkpoint ``src`` as step ``step``: every object (checked by
        S3 against its checksum), each read back by HEAD against the manifests, then COMMIT,
        create-only. Returns the bytes uploaded. Raises before COMMIT when anything is missing
        or differs: the step stays uncommitted (invisible to a restore)."""
        local = json.loads(commit)
        L.check_binding(local, job=job, step=step, tier="remote", where=f"{src} (to {self.where(job, step)})")
        want = L.checkpoint_files(L.fs_for(src)[0], src, local)  # name -> {size, xxh3}: checked against COMMIT
        if self.commit(job, step) is not None:
            return self._already(job, step, commit)
        names = sorted(want)
        with ThreadPoolExecutor(self.s.concurrency, thread_name_prefix="pg-s3-put") as pool:
            list(pool.map(lambda n: self._put_file(os.path.join(src, n), self.key(job, step, n), want[n]), names))
        with ThreadPoolExecutor(self.s.concurrency, thread_name_prefix="pg-s3-head") as pool:
            problems = [p for p in pool.map(lambda n: self._confirm(self.key(job, step, n), want[n]), names) if p]
        if problems:
            raise CorruptCheckpoint(f"{self.where(job, step)}: not committed: {'; '.join(problems[:3])}")
        self._put_commit(job, step, commit)
        return sum(int(w["size"]) for w in want.values())

    def _put_file(self, path: str, key: str, entry: dict[str, Any]) -> None:
        """One object, after its local file was read against the manifest (a file that rotted on
        the local disk is not copied as if it were the checkpoint)."""
        h = xxhash.xxh3_128()
        with open(path, "rb") as f:
            while chunk := f.read(8 * MB):
                h.update(chunk)
        if h.hexdigest() != entry["xxh3"]:
            raise CorruptCheckpoint(f"{path}: does not match its manifest: not copied")
        extra = {"ChecksumAlgorithm": self.s.checksum, "Metadata": {"xxh3": str(entry["xxh3"])}}
        self.client.upload_file(path, self.bucket, key, ExtraArgs=extra, Config=self.transfer)

    def _confirm(self, key: str, entry: dict[str, Any]) -> str | None:
        """Why the stored object is not the one the manifest lists (None: it is)."""
        from botocore.exceptions import ClientError

        try:
            head = self.client.head_object(Bucket=self.bucket, Key=key, ChecksumMode="ENABLED")
        except ClientError as exc:
            return f"{key}: {exc.response['Error']['Code']}"
        if head["ContentLength"] != int(entry["size"]):
            return f"{key}: {head['ContentLength']} bytes stored, {entry['size']} listed"
        if head.get("Metadata", {}).get("xxh3") != entry["xxh3"]:
            return f"{key}: xxh3 {head.get('Metadata', {}).get('xxh3')} stored, {entry['xxh3']} listed"
        return None

    def _put_commit(self, job: str, step: int, commit: bytes) -> None:
        from botocore.exceptions import ClientError

        key = self.key(job, step, L.COMMIT)
        try:
            self.client.put_object(
                Bucket=self.bucket, Key=key, Body=commit, IfNoneMatch="*", ChecksumAlgorithm=self.s.checksum
            )
        except ClientError as exc:
            if exc.response["Error"]["Code"] not in ("PreconditionFailed", "412", "ConditionalRequestConflict"):
                raise
            self._already(job, step, commit)

    def _already(self, job: str, step: int, commit: bytes) -> int:
        """Step ``step`` has a COMMIT already: ours (the same checkpoint: nothing to do) or
        another writer's (refused)."""
        theirs = self.commit(job, step)
        if theirs is None or L.commit_id(theirs) != L.commit_id(json.loads(commit)):
            raise CommitConflict(
                f"{self.where(job, step)}: committed already by another writer with other contents: left as it is"
            )
        log.info("%s: committed already (the same checkpoint)", self.where(job, step))
        return 0

    # -------------------------------------------------------------- housekeeping
    def abort_incomplete(self, job: str) -> list[str]:
        """Abort the multipart uploads of this job's uncommitted steps (a copy cut short);
        returns their keys."""
        committed = {s for s, c in self.steps(job).items() if c}
        aborted = []
        pages = self.client.get_paginator("list_multipart_uploads").paginate(Bucket=self.bucket, Prefix=self._root(job))
        for page in pages:
            for up in page.get("Uploads", []):
                m = _STEP.search("/" + up["Key"].removeprefix(self._root(job)))
                if m and int(m.group(1)) in committed:
                    continue
                self.client.abort_multipart_upload(Bucket=self.bucket, Key=up["Key"], UploadId=up["UploadId"])
                aborted.append(up["Key"])
        if aborted:
            log.warning(
                "aborted %d incomplete upload(s) of uncommitted steps: %s", len(aborted), ", ".join(aborted[:5])
            )
        return aborted

    def delete_step(self, job: str, step: int) -> None:
        """The whole step, COMMIT first: a step half-deleted is uncommitted, never restored."""
        self.client.delete_object(Bucket=self.bucket, Key=self.key(job, step, L.COMMIT))
        keys = [o["Key"] for o in self._objects(f"{self._root(job)}step-{step}/")]
        for i in range(0, len(keys), 1000):
            batch = [{"Key": k} for k in keys[i : i + 1000]]
            self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})

    def retain(self, job: str, keep: int) -> list[int]:
        """Delete all but the newest ``keep`` committed steps (and uncommitted ones older than
        the oldest kept); returns the steps deleted."""
        steps = self.steps(job)
        committed = [s for s, c in steps.items() if c]
        if len(committed) <= keep:
            return []
        oldest_kept = committed[keep - 1]
        gone = [s for s in steps if s < oldest_kept]
        for s in gone:
            self.delete_step(job, s)
        return gone

    # -------------------------------------------------------------- the restore
    def download(self, job: str, step: int, dst: str) -> int:
        """Every object of the step into ``dst`` (made fresh), in parallel; S3 validates each
        object's checksum as it arrives. Returns the bytes read."""
        prefix = f"{self._root(job)}step-{step}/"
        objects = [o for o in self._objects(prefix) if "/" not in o["Key"][len(prefix) :]]
        Path(dst).mkdir(parents=True, exist_ok=True)
        for stale in Path(dst).iterdir():
            stale.unlink()
        lock = threading.Lock()
        total = [0]

        def get(obj: dict[str, Any]) -> None:
            name = obj["Key"][len(prefix) :]
            self.client.download_file(
                self.bucket,
                obj["Key"],
                os.path.join(dst, name),
                ExtraArgs={"ChecksumMode": "ENABLED"},
                Config=self.transfer,
            )
            with lock:
                total[0] += int(obj["Size"])

        with ThreadPoolExecutor(self.s.concurrency, thread_name_prefix="pg-s3-get") as pool:
            list(pool.map(get, objects))
        return total[0]


def _secret(path: str) -> str:
    from powerguard.schemas.file_modes import warn_if_exposed

    warn_if_exposed(path, "S3 secret", log)
    try:
        return Path(path).read_text().strip()
    except OSError as exc:
        raise CheckpointError(f"S3 secret {path}: {exc.strerror}") from None
