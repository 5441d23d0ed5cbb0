"""Secrets stay secret: what PowerGuard writes that holds a key, a credential or a backup of them
is 0600 in a 0700 directory, and a secret it reads that every user of the host can read is a
warning naming the fix, the first time it is read."""

from __future__ import annotations

import logging
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

from powerguard.bus import Bus, BusNames
from powerguard.bus import creds as creds_mod

from .conftest import COMPOSE


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_credentials_and_their_backup_are_private_and_rotated(tmp_path):
    """Before: the guide's `tar -czf creds.tgz` made a 0644 archive of every credential and the
    account signing key, over the only copy."""
    creds = tmp_path / "creds"
    creds_mod.init(creds, names=BusNames(), sites=["dc1"])
    assert mode(creds) == 0o700
    assert {mode(p) for p in [*creds.glob("*.nk"), *creds.glob("*.creds")]} == {0o600}
    out = tmp_path / "offline" / "creds.tgz"
    run = [sys.executable, "-m", "powerguard.cli", "creds", "backup", str(out), "--dir", str(creds)]
    first = subprocess.run(run, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    assert mode(out) == 0o600 and mode(out.parent) == 0o700
    with tarfile.open(out) as tar:
        assert "creds/account-signing.nk" in tar.getnames()
    old = out.read_bytes()
    second = subprocess.run(run, capture_output=True, text=True, timeout=60)
    assert second.returncode == 0 and "creds.tgz.previous" in second.stderr, second.stderr
    previous = out.with_name("creds.tgz.previous")
    assert previous.read_bytes() == old and mode(previous) == 0o600 and mode(out) == 0o600


def test_make_certs_keeps_its_keys_private(tmp_path):
    subprocess.run(["sh", str(COMPOSE / "make-certs.sh"), str(tmp_path / "tls"), "localhost"], check=True)
    tls = tmp_path / "tls"
    assert mode(tls) == 0o700
    assert mode(tls / "ca-key.pem") == 0o600 and mode(tls / "server-key.pem") == 0o600


async def test_a_credential_every_user_can_read_is_a_warning_at_start(tmp_path, caplog):
    """Before: a 0644 credential was used without a word."""
    creds = tmp_path / "creds"
    creds_mod.init(creds, names=BusNames(), sites=["dc1"])
    leaked = creds / "observer.creds"
    leaked.chmod(0o644)
    caplog.set_level(logging.WARNING)
    try:
        await Bus.connect("nats://127.0.0.1:1", service="t", creds_file=leaked, setup=False, connect_timeout=0.5)
    except Exception:  # nothing listens there: the check comes before the connection
        pass
    said = [r.getMessage() for r in caplog.records]
    assert any(f"{leaked} (NATS credential) is mode 0644" in m and f"chmod 600 {leaked}" in m for m in said), said


def test_a_checkpoint_key_every_user_can_read_is_a_warning(tmp_path, caplog):
    from powerguard.ckpt_agent._keys import load_key

    key = tmp_path / "ckpt.key"
    key.write_bytes(b"k" * 32)
    key.chmod(0o644)
    caplog.set_level(logging.WARNING)
    load_key(key)
    assert any(f"{key} (checkpoint key) is mode 0644" in r.getMessage() for r in caplog.records), caplog.text
