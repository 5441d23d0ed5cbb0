"""Threats 8 and 9: scheduler adapters trust no name, and credentials stay in power-control.

8: a job named ``../other/daemon`` used to make the process adapter stop the process group in
   another directory's pid file; a job named ``1234`` made the Slurm adapter requeue Slurm job
   1234. 9: hooks, Slurm commands and launched jobs used to get power-control's whole
   environment (BMC passwords referenced by ``env``); URLs with passwords were logged; a PDU
   without a configured community silently used ``private``."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import time

import pytest

from powerguard.bus import Bus, ConnectError
from powerguard.power_control.config import PowerControlSettings
from powerguard.power_control.drivers import Devices
from powerguard.power_control.errors import PowerControlError, SchedulerError
from powerguard.power_control.schedulers.command import CommandScheduler
from powerguard.power_control.schedulers.process import ProcessScheduler
from powerguard.power_control.schedulers.slurm import SlurmScheduler
from powerguard.schemas import SiteConfig
from tests.integration.power.conftest import slurm  # noqa: F401 (the real Slurm peer)
from tests.integration.ups.nut_peer import free_port
from tests.waiting import eventually

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
SECRET = "bmc-password-that-must-not-leak"


async def test_8_process_adapter_state_never_leaves_its_directory(tmp_path):
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)  # noqa: ASYNC220
    try:
        (tmp_path / "other").mkdir()
        (tmp_path / "other" / "daemon.pid").write_text(f"{victim.pid}\n")  # an unrelated process group
        sched = ProcessScheduler(
            {
                "state_dir": str(tmp_path / "state"),
                "jobs": {"train": {"argv": [sys.executable, "-c", "import time; time.sleep(30)"]}},
            }
        )
        for bad in ("../other/daemon", "a/b", "x y", ""):
            with pytest.raises(SchedulerError, match="cannot be used"):
                await sched.stop_job(bad, nodes=["n1"], saga_id="s1")
            with pytest.raises(SchedulerError):
                await sched.start_job(bad, nodes=["n1"], saga_id="s1")
        assert victim.poll() is None  # untouched
        assert "started job train" in await sched.start_job("train", nodes=["n1"], saga_id="s1")  # the legitimate job
        assert (tmp_path / "state" / "train.pid").exists()
        assert "stopped job train" in await sched.stop_job("train", nodes=["n1"], saga_id="s1")
    finally:
        os.killpg(victim.pid, signal.SIGKILL)
        victim.wait()


async def test_8_slurm_never_takes_a_job_name_for_a_job_id(slurm, tmp_path):  # noqa: F811
    jid = slurm.cmd(
        "sbatch", "--parsable", "--requeue", "-J", "someone-else", "-o", str(tmp_path / "out"), "--wrap", "sleep 600"
    ).strip()
    deadline = time.monotonic() + 30
    while slurm.cmd("squeue", "-h", "-j", jid, "-o", "%T").strip() != "RUNNING":
        assert time.monotonic() < deadline, "the Slurm job never ran"
        await asyncio.sleep(0.2)
    sched = SlurmScheduler({"slurm_conf": str(slurm.conf)})
    try:
        detail = await sched.stop_job(jid, nodes=["n1"], saga_id="s1")  # a PowerGuard job named like the id
        assert detail == f"no slurm job named {jid}"
        assert slurm.cmd("squeue", "-h", "-j", jid, "-o", "%T").strip() == "RUNNING"  # not requeued
        # an explicit mapping in the site file is how an id is named
        mapped = SlurmScheduler({"slurm_conf": str(slurm.conf), "job_ids": {"train": [jid]}})
        assert await mapped.job_ids("train") == [jid]
    finally:
        slurm.cmd("scancel", jid, check=False)


async def test_9_hooks_and_jobs_do_not_get_power_controls_credentials(tmp_path, monkeypatch):
    monkeypatch.setenv("PG_SITE_BMC_PASSWORD", SECRET)  # referenced by the site file as {env: ...}
    monkeypatch.setenv("NATS_PASSWORD", SECRET)
    dump = [sys.executable, "-c", "import os, sys; open(sys.argv[1], 'w').write(repr(dict(os.environ)))"]
    hook = CommandScheduler({"stop": [*dump, str(tmp_path / "hook.env")], "env": {"SITE_HOOK_TOKEN": "for-the-hook"}})
    await hook.stop_job("train", nodes=["n1"], saga_id="s1")
    job = ProcessScheduler(
        {"jobs": {"train": {"argv": [*dump, str(tmp_path / "job.env")], "env": {"WANDB_MODE": "offline"}}}}
    )
    await job.start_job("train", nodes=["n1"], saga_id="s1")
    job_env = tmp_path / "job.env"
    await eventually(lambda: job_env.exists() and job_env.stat().st_size, 5, "the job to write its environment")
    for name, configured in (("hook.env", "SITE_HOOK_TOKEN"), ("job.env", "WANDB_MODE")):
        env = (tmp_path / name).read_text()
        assert SECRET not in env and "PG_SITE_BMC_PASSWORD" not in env
        assert configured in env and "POWERGUARD_JOB" in env and "PATH" in env  # what they need still comes


async def test_9_urls_with_passwords_are_redacted_and_a_pdu_needs_its_community(caplog):
    caplog.set_level(logging.DEBUG)
    with pytest.raises(ConnectError) as exc:
        await Bus.connect(f"nats://admin:{SECRET}@127.0.0.1:{free_port()}", service="x", connect_timeout=1)
    assert SECRET not in str(exc.value) and "admin:***@" in str(exc.value)
    assert SECRET not in caplog.text
    site = SiteConfig.model_validate(
        {"site": "dc1", "ups": [], "nodes": [], "pdus": [{"name": "p1", "host": "127.0.0.1", "port": free_port()}]}
    )
    with pytest.raises(PowerControlError, match=r"pdu p1: SNMP v2c needs options\.community"):
        Devices(site, PowerControlSettings()).pdu("p1")  # no 'private' default for a write community
