"""Rotate and revoke one job's credential while the broker runs: `powerguard creds revoke` (the
docs' procedure) signs the account again and pushes it to the running server, which closes the
credential's open connection and refuses a new one within seconds, with no restart; every other
credential (the job's new one, another job's, the services') still connects; resolver.conf keeps
the revocation across a reload and a restart.

Before: revoke re-signed the operator JWT and the procedure was a reload, which nats-server
refuses for a changed operator ("config reload not supported for TrustedOperators"): the revoked
credential kept its open connection and new ones until the broker restarted. The old test passed
only because `creds init` and `creds revoke` landed in the same second (the same operator JWT)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import nats
import pytest

from powerguard.bus import Bus, ConnectError
from powerguard.bus import creds as creds_mod
from tests.waiting import eventually

from .conftest import start


def powerguard(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "powerguard.cli", *args], capture_output=True, text=True, timeout=60, env=os.environ
    )


async def _refused(url: str, creds) -> str | None:
    try:
        bus = await Bus.connect(url, service="old", creds_file=creds, setup=False, connect_timeout=5, once=True)
    except ConnectError as exc:
        return str(exc)
    await bus.close()
    return None


async def test_a_revoked_job_credential_is_cut_off_at_once_and_the_others_still_work(tmp_path):
    dep = start(tmp_path)
    try:
        old = dep.creds_of("agent", job="jobA")
        # a realistic gap: a site revokes days after `creds init`, never in the same second
        await asyncio.sleep(2.1)
        fresh = creds_mod.issue(dep.creds, "agent", job="jobA", out=dep.creds / "agent-jobA-2.creds")  # the rotation
        pid = dep.server.pid
        lost = asyncio.Event()  # the job's open connection, as its rank holds it
        job = await nats.connect(dep.url, user_credentials=str(old), allow_reconnect=False, closed_cb=_set(lost))

        t0 = time.monotonic()
        revoke = ("creds", "revoke", str(old), "--dir", str(dep.creds), "--url", dep.url)
        out = await asyncio.to_thread(powerguard, *revoke)
        assert out.returncode == 0, out.stderr
        assert "pushed to 1 of 1 server(s)" in out.stderr, out.stderr
        assert "checked: a new connection with it is refused" in out.stderr, out.stderr
        await asyncio.wait_for(lost.wait(), 5)  # the open connection closed by the server
        assert time.monotonic() - t0 < 5 + 10  # the command itself (its check) and the close
        assert job.is_closed
        refusal = await _refused(dep.url, old)
        assert refusal and "refused the credential" in refusal, refusal
        assert dep.server.pid == pid and dep.server.proc.poll() is None  # no restart
        for path in (fresh, dep.creds_of("agent", job="jobB"), dep.creds_of("ups-monitor")):
            assert await _refused(dep.url, path) is None, path

        # the file the docs copy keeps it: a reload is accepted (the operator JWT is the one the
        # server started with) and a restart still refuses the credential
        log = dep.server.log_file
        before = len(log.read_text(errors="replace"))
        os.kill(dep.server.pid, signal.SIGHUP)

        def reload_said() -> list[str]:
            lines = log.read_text(errors="replace")[before:].splitlines()
            done = any(m in ln for ln in lines for m in ("Reloaded server configuration", "Failed to reload"))
            return lines if done else []

        said = await eventually(reload_said, timeout=30, what="the server's log saying the reload was done")
        assert not any("[ERR]" in ln for ln in said), f"the reload failed: {said}"
        dep.server.stop()
        dep.server.start()
        refusal = await _refused(dep.url, old)
        assert refusal and "refused the credential" in refusal, refusal
        assert await _refused(dep.url, fresh) is None
        check = await asyncio.to_thread(powerguard, "creds", "check", str(old), "--url", dep.url)
        assert check.returncode == 1 and "refused" in check.stderr, check.stderr
    finally:
        dep.server.stop()


def _set(event: asyncio.Event):
    async def cb(*_a) -> None:
        event.set()

    return cb


def test_revoke_refuses_a_credential_of_another_account(tmp_path):
    from powerguard.bus import BusNames
    from powerguard.schemas import ConfigError

    creds_mod.init(tmp_path / "a", names=BusNames(), sites=["dc1"])
    creds_mod.init(tmp_path / "b", names=BusNames(), sites=["dc1"])
    with pytest.raises(ConfigError, match="was not issued by the account"):
        creds_mod.revoke(tmp_path / "a", tmp_path / "b" / "observer.creds")


def test_the_operator_jwt_is_signed_once_and_force_signs_a_new_one(tmp_path):
    from powerguard.bus import BusNames

    creds_mod.init(tmp_path, names=BusNames(), sites=["dc1"])
    first = (tmp_path / "operator.jwt").read_text()
    time.sleep(1.1)  # a later second: a JWT signed again would differ (its iat)
    creds_mod.revoke(tmp_path, tmp_path / "observer.creds")
    assert f'operator: "{first}"' in (tmp_path / "resolver.conf").read_text()
    creds_mod.init(tmp_path, names=BusNames(), sites=["dc1"], force=True)
    assert (tmp_path / "operator.jwt").read_text() != first


async def test_a_revoked_jobs_ranks_back_off_instead_of_hammering_the_broker(deployment, caplog):
    """Before: a rank whose credential was revoked tried again every 0.25 s (6,712 "Authorization
    Violation" lines in 16 min in the job's log, as many in the broker's), and a connection the
    server closed was never made again. Now the rank says so and connects again backing off (1 s,
    2 s, 4 s, ... 60 s, ±20 %): four tries refused by the server take more than 5 s, not 1 s."""
    from powerguard.bus.revocation import push, try_connect
    from powerguard.ckpt_agent._bus import BusThread
    from powerguard.schemas import AgentData

    dep = deployment
    try:
        old = dep.creds_of("agent", job="jobA")
        await asyncio.sleep(1.1)  # the revocation covers credentials issued before this second
        agent = AgentData(job="jobA", rank=0, world_size=1, node="n1")
        rank = BusThread(url=dep.url, names=dep.names, agent=agent, heartbeat_s=1.0, auth={"creds_file": str(old)})
        await asyncio.to_thread(rank.start)
        assert rank.bus is not None
        log = dep.server.log_file
        before = len(log.read_text(errors="replace"))
        done = creds_mod.revoke(dep.creds, old)
        await try_connect(dep.url, old, {})
        await push(dep.url, {"creds_file": creds_mod.system_creds(dep.creds)}, done.account, done.account_jwt)

        def refusals() -> list[float]:
            lines = log.read_text(errors="replace")[before:].splitlines()
            return [t for ln in lines if "authentication error" in ln.lower() and (t := _when(ln)) is not None]

        await eventually(lambda: len(refusals()) >= 4, timeout=60, what="four tries refused by the server")
        got = refusals()
        assert got[3] - got[0] >= 5.0, f"four tries in {got[3] - got[0]:.2f}s: no backoff"
        assert "the NATS server closed this rank's connection" in caplog.text
    finally:
        await asyncio.to_thread(rank.close)


def _when(line: str) -> float | None:
    """The time of a nats-server log line (``[pid] 2026/12/04 20:11:12.262785 [ERR] ...``)."""
    import datetime as dt

    parts = line.split()
    try:
        return dt.datetime.strptime(f"{parts[1]} {parts[2]}", "%Y/%m/%d %H:%M:%S.%f").timestamp()
    except (IndexError, ValueError):
        return None
