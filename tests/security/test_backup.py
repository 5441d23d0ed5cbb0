"""Back up a live deployment's JetStream state with the admin credential and restore it onto a
fresh broker (the same credentials): the events, every KV bucket's values and the services'
durable consumers with their positions come back; a damaged backup and a restore over an
existing stream are refused in words."""

from __future__ import annotations

import shutil
import stat

import pytest

from powerguard.bus import EmbeddedNats
from powerguard.bus.backup import BackupError, backup, restore, verify
from powerguard.bus.roles import durable_names
from powerguard.schemas import OnBattery, PowerData
from tests.integration.ups.nut_peer import free_port

from .conftest import COMPOSE, SITE, Deployment


async def test_backup_then_restore_onto_a_fresh_broker(deployment, tmp_path):
    dep = deployment
    ups = await dep.connect("ups-monitor")
    for _ in range(3):
        await ups.publish(OnBattery(data=PowerData(site=SITE, ups="ups1", on_battery=True)))
    await (await ups.kv(dep.names.ups)).put("dc1.ups1", {"flags": {"on_battery": True}, "seq": 7})
    coord = await dep.connect("coordinator")
    await (await coord.kv(dep.names.sagas)).put("s-1", {"state": "holding"})
    admin = await dep.connect("admin")
    before = await admin.js.stream_info(dep.names.stream)
    durable = durable_names(SITE)["coordinator"]

    saved = await backup(admin, tmp_path / "backup")
    assert {s.stream for s in saved} >= {dep.names.stream, f"KV_{dep.names.sagas}", f"KV_{dep.names.ups}"}
    assert verify(tmp_path / "backup")
    with pytest.raises(BackupError, match="the stream exists on this server"):
        await restore(admin, tmp_path / "backup")

    # a fresh broker, the same deployment's credentials
    fresh_dir = tmp_path / "fresh"
    fresh_dir.mkdir()
    shutil.copy(COMPOSE / "nats.conf", fresh_dir / "nats.conf")
    shutil.copytree(dep.creds, fresh_dir / "auth")
    server = EmbeddedNats(
        store_dir=fresh_dir / "store", extra_args=["-c", str(fresh_dir / "nats.conf"), "-m", str(free_port())]
    )
    server.start()
    fresh = Deployment(server=server, creds=fresh_dir / "auth", names=dep.names)
    try:
        admin2 = await fresh.connect("admin")
        restored = await restore(admin2, tmp_path / "backup")
        assert dep.names.stream in restored
        after = await admin2.js.stream_info(dep.names.stream)
        assert after.state.messages == before.state.messages and after.state.last_seq == before.state.last_seq
        assert (await admin2.js.consumer_info(dep.names.stream, durable)).name == durable
        coord2 = await fresh.connect("coordinator")
        assert (await (await coord2.kv(dep.names.sagas)).get("s-1")).json() == {"state": "holding"}
        ups2 = await fresh.connect("ups-monitor")
        assert (await (await ups2.kv(dep.names.ups)).get("dc1.ups1")).json()["seq"] == 7
    finally:
        await fresh.close()


def test_a_damaged_backup_is_refused_naming_the_file(tmp_path):
    with pytest.raises(BackupError, match=r"no readable manifest\.json"):
        verify(tmp_path)
    (tmp_path / "manifest.json").write_text('{"streams": ["S"], "files": {"S.snapshot": {"bytes": 3, "sha256": "00"}}}')
    (tmp_path / "S.snapshot").write_bytes(b"abc")
    with pytest.raises(BackupError, match=r"S\.snapshot: not the file the backup wrote"):
        verify(tmp_path)


async def test_a_backup_is_private_and_never_costs_the_last_good_one(deployment, tmp_path):
    """Before: the snapshots were written with the process's umask (0644: the event-id secret
    readable by every user of the host) over the only copy."""
    dep = deployment
    admin = await dep.connect("admin")
    latest = tmp_path / "backups" / "latest"
    await backup(admin, latest)
    first = (latest / "manifest.json").read_bytes()
    assert stat.S_IMODE(latest.stat().st_mode) == 0o700
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in latest.iterdir()}
    assert "manifest.json" in modes and set(modes.values()) == {0o600}, modes

    # a backup that fails (the observer may not take snapshots) leaves the last good one in place
    observer = await dep.connect("observer")
    with pytest.raises(BackupError):
        await backup(observer, latest, timeout=2)
    assert (latest / "manifest.json").read_bytes() == first and verify(latest)

    await backup(admin, latest)  # the next one: the one it replaces is kept
    previous = latest.with_name("latest.previous")
    assert (previous / "manifest.json").read_bytes() == first and verify(previous) and verify(latest)
    assert not latest.with_name("latest.partial").exists()
