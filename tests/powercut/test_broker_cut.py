"""A real nats-server whose JetStream store is on the power-cut filesystem: messages the server
acknowledged survive a power cut (the server killed, everything it had not fsynced gone) with
the broker settings PowerGuard ships (``sync_interval: always``), and do not with NATS's default.

On a journaling file system (ext4, XFS: any fsync commits every earlier create): nats-server
2.15 fsyncs a stream's message blocks but not the directories it creates them in, so on a file
system that keeps only what POSIX promises (a name is durable once its directory is fsynced)
even ``always`` loses the stream; the last test pins that down, so the day nats-server fsyncs
its directories it fails and the docs' file-system requirement can go."""

from __future__ import annotations

import pytest
from nats.js import api

from powerguard.bus import EmbeddedNats


async def _publish_acked(url: str, n: int) -> list[int]:
    import nats

    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        await js.add_stream(name="S", subjects=["s.>"], storage=api.StorageType.FILE)
        return [(await js.publish(f"s.{i}", f"m{i}".encode())).seq for i in range(n)]
    finally:
        await nc.close()


async def _stored(url: str) -> list[bytes]:
    import nats

    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        try:
            info = await js.stream_info("S")
        except Exception:
            return []
        out = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            try:
                out.append((await js.get_msg("S", seq)).data)
            except Exception:
                continue
        return out
    finally:
        await nc.close()


async def _cut_and_restart(powercut, server: EmbeddedNats) -> EmbeddedNats:
    server.kill()  # the power goes: no shutdown, no flush
    powercut.cut()
    powercut.start()
    again = EmbeddedNats(port=server.port, store_dir=server.store_dir, sync=server.sync)
    return again.start()


@pytest.mark.parametrize("sync, survive", [("always", True), ("2m", False)])
async def test_acknowledged_messages_survive_a_cut_only_with_sync_always(powercut_journal, sync, survive):
    powercut = powercut_journal
    server = EmbeddedNats(store_dir=powercut.mountpoint / "nats", sync=sync).start()
    try:
        acked = await _publish_acked(server.url, 50)
        assert acked == list(range(1, 51))
        server = await _cut_and_restart(powercut, server)
        stored = await _stored(server.url)
        if survive:
            assert stored == [f"m{i}".encode() for i in range(50)]
        else:  # NATS's default: acknowledged from the page cache, gone with the power
            assert len(stored) < 50
    finally:
        server.kill()


async def test_on_posix_promises_alone_nats_server_loses_even_a_synced_stream(powercut):
    """nats-server does not fsync the directories of its store: a documented limitation."""
    server = EmbeddedNats(store_dir=powercut.mountpoint / "nats", sync="always").start()
    try:
        await _publish_acked(server.url, 5)
        server = await _cut_and_restart(powercut, server)
        assert await _stored(server.url) == []
    finally:
        server.kill()
