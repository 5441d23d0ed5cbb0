"""Rotate and revoke one job's credential without re-issuing the others: `creds revoke` writes the
account again with the revocation; after the server reloads resolver.conf the revoked credential
is refused and every other one (the job's new one, another job's, the services') still connects."""

from __future__ import annotations

import os
import signal

import pytest

from powerguard.bus import Bus, ConnectError
from powerguard.bus import creds as creds_mod
from tests.waiting import eventually

from .conftest import start


async def test_a_revoked_job_credential_is_refused_and_the_others_still_work(tmp_path):
    dep = start(tmp_path)
    try:
        old = dep.creds_of("agent", job="jobA")
        fresh = creds_mod.issue(dep.creds, "agent", job="jobA", out=dep.creds / "agent-jobA-2.creds")  # the rotation
        await (await dep.connect("agent", job="jobA")).close()  # the old one works until revoked

        name, _ = creds_mod.revoke(dep.creds, old)
        assert name == "agent.jobA"
        log = dep.server.log_file
        before = log.read_text(errors="replace")
        os.kill(dep.server.pid, signal.SIGHUP)  # the server reloads auth/resolver.conf

        def reload_said() -> list[str]:  # what the server logged about the reload: its end shows it was processed
            lines = log.read_text(errors="replace")[len(before) :].splitlines()
            ended = ("Reloaded server configuration", "Failed to reload")
            done = any(mark in ln for ln in lines for mark in ended)
            return lines if done else []

        said = await eventually(reload_said, timeout=30, what="the server's log saying the reload was done")
        assert not any("[ERR]" in ln for ln in said), f"the reload failed: {said}"

        seen: list[str] = []  # what each try got, for the failure's message

        async def refused() -> bool:
            try:
                bus = await Bus.connect(dep.url, service="old", creds_file=old, setup=False, connect_timeout=5)
            except ConnectError as exc:
                seen.append(str(exc))
                return "refused the credential" in str(exc)
            seen.append("connected")
            await bus.close()
            return False

        try:
            await eventually(refused, timeout=30, what="the revoked credential refused", every=0.5)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the last tries got {seen[-3:]}; the server's reload: {said}") from None
        for path in (fresh, dep.creds_of("agent", job="jobB"), dep.creds_of("ups-monitor")):
            bus = await Bus.connect(dep.url, service="ok", creds_file=path, setup=False, connect_timeout=5)
            await bus.close()
    finally:
        dep.server.stop()


def test_revoke_refuses_a_credential_of_another_account(tmp_path):
    from powerguard.bus import BusNames
    from powerguard.schemas import ConfigError

    creds_mod.init(tmp_path / "a", names=BusNames(), sites=["dc1"])
    creds_mod.init(tmp_path / "b", names=BusNames(), sites=["dc1"])
    with pytest.raises(ConfigError, match="was not issued by the account"):
        creds_mod.revoke(tmp_path / "a", tmp_path / "b" / "observer.creds")
