"""Power cuts of the S3 tier's uploader: a process copying a committed checkpoint to a real S3
server (SeaweedFS) dies at a random moment (SIGKILL: the training host lost power; S3 keeps what
it stored). After each cut:

* a step whose copy was reported done (what raises the acks to ``remote``) is committed on S3;
* a committed step is whole: every object the COMMIT names is there and matches its manifest
  (read back and verified as a restore does);
* an uncommitted step is no candidate, and the multipart uploads the cut left are aborted by
  the next start (``abort_incomplete``)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

JOB = "jcut"
UPLOADER = """
import json, random, sys, time
from pathlib import Path
from powerguard.ckpt_agent import _layout as L
from powerguard.ckpt_agent._s3 import RemoteSettings, S3Store
src, url, options, job = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[6]
step, seed = int(sys.argv[4]), int(sys.argv[5])
rng = random.Random(seed)
s = S3Store(url, RemoteSettings(**options))
print("ready", flush=True)  # imports done: the copy starts now
for op in ("UploadPart", "PutObject", "CompleteMultipartUpload", "HeadObject"):  # a link of uneven speed
    s.client.meta.events.register(f"before-send.s3.{op}", lambda **_: time.sleep(rng.uniform(0, 0.04)))
commit = L.rebound(json.loads(Path(src, L.COMMIT).read_bytes()), tier="remote", key=None)
s.upload(src, job, step, commit)
print("copied", flush=True)
"""


@dataclass
class S3Cut:
    seed: int
    step: int
    after_s: float
    acked: bool = False
    committed: bool = False
    violations: list[str] = field(default_factory=list)


def local_checkpoint(tmp: Path) -> str:
    """One committed local checkpoint of ~12 MiB (multipart at 5 MiB parts), made once."""
    import torch

    from powerguard.ckpt_agent import CheckpointAgent
    from powerguard.ckpt_agent import _layout as L

    root = tmp / "s3cut-local"
    src = L.step_dir(str(root), JOB, 1)
    if not Path(src, L.COMMIT).exists():
        torch.manual_seed(0)
        agent = CheckpointAgent(job=JOB, model=torch.nn.Linear(1792, 1792), local_dir=root, local_every_s=0)
        agent.save(1)
        agent.close()
    return src


def s3_cut(tmp: Path, seed: int, server, url: str) -> S3Cut:
    """One cut of the uploader at a random moment of its copy (to a prefix of the seed's own)."""
    from powerguard.ckpt_agent import _layout as L
    from powerguard.ckpt_agent._s3 import RemoteSettings, S3Store

    rng = random.Random(seed)
    src = local_checkpoint(tmp)
    step = 1
    url = f"{url}/seed-{seed}"
    options = server.options(part_size_mb=5, concurrency=2)
    cut = S3Cut(seed, step, after_s=rng.uniform(0.0, 0.45))  # a copy takes ~0.2-0.4 s here
    proc = subprocess.Popen(
        [sys.executable, "-c", UPLOADER, src, url, json.dumps(options), str(step), str(seed), JOB],
        env={**os.environ, **server.env()},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    assert proc.stdout is not None
    ready = proc.stdout.readline()  # the uploader's imports (torch) take longer than its copy
    assert ready.startswith(b"ready"), ready
    time.sleep(cut.after_s)  # the cut's random moment into the copy (the campaign's input, not a wait)
    os.killpg(proc.pid, signal.SIGKILL)
    out, _ = proc.communicate(timeout=30)
    cut.acked = b"copied" in out
    store = S3Store(url, RemoteSettings(**options))
    cut.committed = bool(store.steps(JOB).get(step))
    if cut.acked and not cut.committed:
        cut.violations.append(f"seed {seed}: the copy of step {step} was reported done and is not committed")
    if cut.committed:
        staged = tmp / f"s3cut-read-{seed}"
        store.download(JOB, step, str(staged))
        fs, path = L.fs_for(str(staged))
        try:
            commit = L.read_commit(fs, path)
            L.check_binding(commit, job=JOB, step=step, tier="remote", where=path)
            files = L.manifest_files(fs, path, commit)
            L.verify_files(fs, path, files, sorted(files), None)
            L.verify_metadata(fs, path, commit)
        except Exception as exc:
            cut.violations.append(f"seed {seed}: step {step} committed but not whole: {exc}")
    store.abort_incomplete(JOB)
    prefix = url.split("/", 3)[3] + f"/{JOB}/step-{step}/"  # s3://bucket/<prefix>
    left = store.client.list_multipart_uploads(Bucket=store.bucket, Prefix=prefix).get("Uploads", [])
    if left:
        cut.violations.append(f"seed {seed}: {len(left)} incomplete upload(s) of step {step} left after the next start")
    return cut
