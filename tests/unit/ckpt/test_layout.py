"""Checkpoint layout and durability markers, on a real filesystem, without torch.distributed."""

from __future__ import annotations

import json

import fsspec
import pytest

from powerguard.ckpt_agent import CorruptCheckpoint, verify_checkpoint
from powerguard.ckpt_agent import _keys as K
from powerguard.ckpt_agent import _layout as L

FS = fsspec.filesystem("file")


def make(root, step, *, commit=True, payload=b"x" * 1000, key=None):
    """A one-rank checkpoint written the way the agent writes one (signed with the job's key
    derived from the site ``key``, when given)."""
    key = K.job_key(key, "job") if key is not None else None
    d = L.step_dir(str(root), "job", step)
    FS.makedirs(d, exist_ok=True)
    (root / "job" / f"step-{step}" / "__0_0.distcp").write_bytes(payload)
    (root / "job" / f"step-{step}" / ".metadata").write_bytes(b"meta")
    size, digest, keyed = L.hash_file(FS, f"{d}/__0_0.distcp", key)
    entry = {"size": size, "xxh3": digest, **({K.KEYED: keyed} if key else {})}
    mdigest, nbytes, mkeyed = L.write_manifest(FS, d, 0, step, {"__0_0.distcp": entry}, key=key)
    assert nbytes == len(payload)
    if commit:
        L.write_commit(
            FS,
            d,
            job="job",
            tier="local",
            step=step,
            world_size=1,
            digests={0: mdigest},
            metadata_digest=L.digest_bytes(b"meta"),
            key=key,
            keyed_manifests={0: mkeyed},
            metadata=b"meta",
        )
    return d


def test_committed_checkpoint_verifies(tmp_path):
    d = make(tmp_path, 10)
    commit = verify_checkpoint(d)
    assert commit["step"] == 10 and commit["world_size"] == 1
    assert not list((tmp_path / "job" / "step-10").glob("*.tmp"))


def test_missing_commit_is_refused(tmp_path):
    d = make(tmp_path, 10, commit=False)
    with pytest.raises(CorruptCheckpoint, match="no COMMIT"):
        verify_checkpoint(d)


def test_a_flipped_byte_is_found(tmp_path):
    d = make(tmp_path, 10)
    f = tmp_path / "job" / "step-10" / "__0_0.distcp"
    data = bytearray(f.read_bytes())
    data[500] ^= 0xFF
    f.write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpoint, match="checksum mismatch"):
        verify_checkpoint(d)


def test_truncated_file_and_edited_manifest_are_found(tmp_path):
    d = make(tmp_path, 10)
    (tmp_path / "job" / "step-10" / "__0_0.distcp").write_bytes(b"x" * 10)
    with pytest.raises(CorruptCheckpoint, match="10 bytes, manifest says 1000"):
        verify_checkpoint(d)
    d = make(tmp_path, 20)
    m = tmp_path / "job" / "step-20" / L.manifest_name(0)
    body = json.loads(m.read_text())
    body["files"]["__0_0.distcp"]["size"] = 5
    m.write_text(json.dumps(body))
    with pytest.raises(CorruptCheckpoint, match="does not match COMMIT"):
        verify_checkpoint(d)


def test_retention_keeps_the_newest_committed(tmp_path):
    for step in (10, 20, 30, 40):
        make(tmp_path, step)
    make(tmp_path, 5, commit=False)
    make(tmp_path, 50, commit=False)  # a save in progress is never removed
    removed = L.retain(FS, str(tmp_path), "job", keep=2)
    assert sorted(int(r.rsplit("-", 1)[1]) for r in removed) == [5, 10, 20]
    assert [s for s, _ in L.list_steps(FS, str(tmp_path), "job")] == [50, 40, 30]


@pytest.mark.parametrize("name", ["../../../../dev/zero", "/dev/zero", "..", "a/../../b"])
def test_a_manifest_naming_a_file_outside_the_checkpoint_is_refused(tmp_path, name):
    d = L.step_dir(str(tmp_path), "job", 5)
    FS.makedirs(d, exist_ok=True)
    (tmp_path / "job" / "step-5" / ".metadata").write_bytes(b"meta")
    mdigest, _, _ = L.write_manifest(FS, d, 0, 5, {name: {"size": 1, "xxh3": "0" * 32}})
    meta = L.digest_bytes(b"meta")
    L.write_commit(FS, d, job="job", tier="local", step=5, world_size=1, digests={0: mdigest}, metadata_digest=meta)
    with pytest.raises(CorruptCheckpoint, match="outside the checkpoint"):
        verify_checkpoint(d)


def test_the_verify_command_says_what_a_restore_would_trust(tmp_path, capsys):
    from powerguard.ckpt_agent.__main__ import main

    good, bad = make(tmp_path, 10), make(tmp_path, 20)
    (tmp_path / "job" / "step-20" / "__0_0.distcp").write_bytes(b"y" * 1000)  # a flipped payload
    assert main(["verify", good]) == 0
    assert main(["verify", good, bad]) == 1
    out = capsys.readouterr().out
    assert f"OK   {good}: step 10" in out and f"BAD  {bad}: CorruptCheckpoint" in out and "checksum mismatch" in out


def forge(d: str, payload: bytes) -> None:
    """What whoever can write a tier can do without the key: replace a data file and rewrite
    every unkeyed checksum after it (manifest, COMMIT), keeping the old signature fields."""
    with open(f"{d}/__0_0.distcp", "wb") as f:
        f.write(payload)
    size, digest, _ = L.hash_file(FS, f"{d}/__0_0.distcp")
    manifest = json.loads(open(f"{d}/{L.manifest_name(0)}", "rb").read())
    manifest["files"]["__0_0.distcp"].update(size=size, xxh3=digest)
    body = json.dumps(manifest, sort_keys=True).encode()
    open(f"{d}/{L.manifest_name(0)}", "wb").write(body)
    commit = json.loads(open(f"{d}/COMMIT", "rb").read())
    commit["manifests"]["0"] = L.digest_bytes(body)
    open(f"{d}/COMMIT", "wb").write(json.dumps(commit, sort_keys=True).encode())


def test_a_site_key_refuses_a_checkpoint_forged_on_a_writable_tier(tmp_path):
    """Unkeyed checksums find corruption, not forgery: the forged checkpoint verifies without
    the key. With the site key its signature or keyed digests no longer match."""
    key_file = tmp_path / "ckpt.key"
    key_file.write_bytes(b"k" * 32)
    key = K.load_key(key_file)
    d = make(tmp_path, 30, key=key)
    assert verify_checkpoint(d, key=key)["step"] == 30
    forge(d, b"evil" * 250)
    assert verify_checkpoint(d)["step"] == 30  # what an unkeyed restore would trust
    with pytest.raises(CorruptCheckpoint, match=r"COMMIT signature does not match|keyed digest"):
        verify_checkpoint(d, key=key)
    unsigned = make(tmp_path, 40)  # written before the site had a key, or by someone without it
    with pytest.raises(CorruptCheckpoint, match="not signed with a checkpoint key"):
        verify_checkpoint(unsigned, key=key)
    other = tmp_path / "other.key"
    other.write_bytes(b"o" * 32)
    with pytest.raises(CorruptCheckpoint, match="does not match the job's key"):
        verify_checkpoint(make(tmp_path, 50, key=key), key=K.load_key(other))


def test_the_verify_command_checks_the_signature_with_a_key_file(tmp_path, capsys):
    from powerguard.ckpt_agent.__main__ import main

    key_file = tmp_path / "ckpt.key"
    key_file.write_bytes(b"k" * 32)
    signed, unsigned = make(tmp_path, 10, key=K.load_key(key_file)), make(tmp_path, 20)
    assert main(["verify", "--key-file", str(key_file), signed]) == 0
    assert main(["verify", "--key-file", str(key_file), unsigned]) == 1
    out = capsys.readouterr().out
    assert "signed with job 'job''s key" in out and "not signed with a checkpoint key" in out
    short = tmp_path / "short.key"
    short.write_bytes(b"k")
    assert main(["verify", "--key-file", str(short), signed]) == 2
