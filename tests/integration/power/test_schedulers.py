"""Scheduler adapters against real peers (Slurm, dockerd, local processes, a user hook),
each through a full shutdown and restore sequence of power-control on a real nats-server."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from powerguard.power_control.schedulers.process import ProcessScheduler
from powerguard.schemas import (
    JobRestarted,
    JobRestartRequested,
    JobStopped,
    JobStopRequested,
    PowerActionDone,
    PowerActionFailed,
)
from tests.waiting import eventually

from .helpers import Recorder, announce_saga, creds, job_cmd, power_on, service, shutdown, site

pytestmark = pytest.mark.integration


def bmc_node(name: str, bmc, cred: dict) -> dict:
    return {"name": name, "bmc": {"driver": "ipmi", "host": "127.0.0.1", "port": bmc.port, **cred}}


async def outage(bus, rec, node: str, job: str) -> None:
    """shutdown (with the job) -> off -> power on -> ready -> job restart -> restarted."""
    await bus.publish(shutdown(node, jobs=[job]))
    await rec.wait(lambda: "off" in rec.states(node), what=f"{node} off")


async def restore(bus, rec, node: str, job: str) -> None:
    await bus.publish(power_on(node))
    await rec.wait(lambda: "ready" in rec.states(node), timeout=60, what=f"{node} ready")
    await bus.publish(job_cmd(JobRestartRequested, job, [node]))
    await rec.wait(
        lambda: rec.of(JobRestarted, job=job) or rec.of(PowerActionFailed, action="job_start"), what=f"{job} restarted"
    )
    assert not rec.of(PowerActionFailed), rec.of(PowerActionFailed)[0].data.error


async def until(fn, timeout: float = 30.0):
    return await eventually(fn, timeout, "the scheduler's state", every=0.2)


async def test_slurm_drains_requeues_resumes_and_releases(make_bus, make_bmc, slurm, tmp_path, monkeypatch):
    cred = creds(monkeypatch)
    bmc = make_bmc("n1", soft_off_delay=0.1, boot_delay=0.2)
    out = tmp_path / "train.out"
    jid = slurm.cmd(
        "sbatch",
        "--parsable",
        "--requeue",
        "--open-mode=append",
        "-J",
        "train",
        "-o",
        str(out),
        "--wrap",
        "echo started; sleep 600",
    ).strip()
    assert await until(lambda: slurm.cmd("squeue", "-h", "-j", jid, "-o", "%T").strip() == "RUNNING")
    cfg = site(
        [bmc_node("n1", bmc, cred)],
        scheduler={
            "kind": "slurm",
            "options": {"slurm_conf": str(slurm.conf), "node_map": {"n1": slurm.node}, "resume_timeout_s": 60},
        },
    )
    bus = await make_bus("power-control")
    rec = await Recorder().start(bus)
    pc = await service(bus, cfg)
    try:
        await outage(bus, rec, "n1", "train")
        info = slurm.cmd("scontrol", "show", "node", slurm.node)
        assert "DRAIN" in info and "powerguard: outage saga-1" in info
        job = slurm.cmd("scontrol", "show", "job", jid)
        state = " ".join(w for w in job.split() if w.startswith(("JobState=", "Reason=")))
        assert "JobState=PENDING" in state and "held" in state.lower(), state  # requeued and held, not lost
        assert bmc.power == "off"
        await restore(bus, rec, "n1", "train")
        assert slurm.node_state() in ("idle", "mixed", "allocated")
        assert await until(lambda: slurm.cmd("squeue", "-h", "-j", jid, "-o", "%T").strip() == "RUNNING", 60)
        assert await until(lambda: out.exists() and out.read_text().count("started") == 2)
    finally:
        await pc.stop()
        slurm.cmd("scancel", jid, check=False)


async def test_docker_stops_and_starts_the_jobs_containers(make_bus, make_bmc, dockerd, monkeypatch):
    cred = creds(monkeypatch)
    bmc = make_bmc("n1", soft_off_delay=0.1, boot_delay=0.2)
    client = dockerd.client()
    labels = {"powerguard.job": "train", "powerguard.node": "n1", "powerguard.test": "1"}
    ct = client.containers.run(dockerd.IMAGE, ["sleep", "600"], detach=True, labels=labels, network_mode="none")
    other = client.containers.run(
        dockerd.IMAGE,
        ["sleep", "600"],
        detach=True,
        network_mode="none",
        labels={"powerguard.job": "other", "powerguard.test": "1"},
    )
    cfg = site(
        [bmc_node("n1", bmc, cred)],
        scheduler={"kind": "docker", "options": {"base_url": dockerd.host, "stop_timeout_s": 1}},
    )
    bus = await make_bus("power-control")
    rec = await Recorder().start(bus)
    pc = await service(bus, cfg)
    try:
        await outage(bus, rec, "n1", "train")
        ct.reload()
        other.reload()
        assert ct.status == "exited" and other.status == "running"
        await restore(bus, rec, "n1", "train")
        ct.reload()
        assert ct.status == "running"
        assert "started container" in rec.of(PowerActionDone, action="job_start")[0].data.detail
    finally:
        await pc.stop()
        for c in (ct, other):
            c.remove(force=True)


async def test_process_launcher_stops_and_restarts_a_job(make_bus, make_bmc, tmp_path, monkeypatch):
    cred = creds(monkeypatch)
    bmc = make_bmc("n1", soft_off_delay=0.1, boot_delay=0.2)
    pids = tmp_path / "pids"
    script = f"import os, time; open({str(pids)!r}, 'a').write(f'{{os.getpid()}}\\n'); time.sleep(600)"
    cfg = site(
        [bmc_node("n1", bmc, cred)],
        scheduler={
            "kind": "process",
            "options": {"stop_timeout_s": 5, "jobs": {"train": {"argv": [sys.executable, "-c", script]}}},
        },
    )
    bus = await make_bus("power-control")
    rec = await Recorder().start(bus)
    pc = await service(bus, cfg)
    try:
        await pc.scheduler.start_job("train", nodes=["n1"], saga_id="boot")
        assert await until(lambda: pids.exists() and pids.read_text().strip())
        first = int(pids.read_text().split()[0])
        await outage(bus, rec, "n1", "train")
        assert not psutil.pid_exists(first) or psutil.Process(first).status() == psutil.STATUS_ZOMBIE
        await restore(bus, rec, "n1", "train")
        assert await until(lambda: len(pids.read_text().split()) == 2)
        second = int(pids.read_text().split()[1])
        assert psutil.pid_exists(second) and second != first
    finally:
        await pc.scheduler.stop_job("train", nodes=["n1"], saga_id="end")
        await pc.stop()


async def test_a_job_stop_delivered_after_its_saga_restarted_the_job_is_refused(make_bus, tmp_path):
    """A power-control killed mid-shutdown never acks the saga's job stop; the node shutdowns
    stop the job themselves, the saga restores and restarts it, and the stop comes again once
    the ack wait is over (the chaos campaign's seed 7: the restarted training was killed 2.4 s
    after it resumed, and never finished). The late stop is refused by name; the job runs on."""
    pids = tmp_path / "pids"
    script = f"import os, time; open({str(pids)!r}, 'a').write(f'{{os.getpid()}}\\n'); time.sleep(600)"
    cfg = site(
        [{"name": "n1"}],
        scheduler={"kind": "process", "options": {"jobs": {"train": {"argv": [sys.executable, "-c", script]}}}},
    )
    bus = await make_bus("power-control")
    rec = await Recorder().start(bus)
    pc = await service(bus, cfg, sagas=())
    await announce_saga(bus, "saga-back", state="done")
    try:
        await pc.scheduler.start_job("train", nodes=["n1"], saga_id="saga-back")
        assert await until(lambda: pids.exists() and pids.read_text().strip())
        await bus.publish(job_cmd(JobStopRequested, "train", ["n1"], saga="saga-back"))
        await rec.wait(
            lambda: rec.of(PowerActionFailed, action="job_stop") or rec.of(JobStopped, job="train"),
            what="the late stop handled",
        )
        assert not rec.of(JobStopped, job="train"), "a stop of a saga that had moved on stopped the job"
        assert "saga-back is done: its stop of job train is over" in rec.of(PowerActionFailed)[0].data.error
        pid = int(pids.read_text().split()[0])
        assert pc.scheduler.running("train") and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    finally:
        await pc.scheduler.stop_job("train", nodes=["n1"], saga_id="end")
        await pc.stop()


async def test_a_job_the_launcher_cannot_find_is_a_failure_not_a_success(tmp_path):
    """Before: a job started by hand (no pid file) was answered "not running" as a success while
    it trained on through the outage. Now the stop fails naming the pid file it needs; a job whose
    recorded process group has exited is still "not running" (nothing to stop)."""
    from powerguard.power_control.errors import SchedulerError

    state = tmp_path / "jobs"
    state.mkdir()
    sched = ProcessScheduler({"state_dir": str(state)})
    with pytest.raises(SchedulerError, match=r"no pid file .*train\.pid: it was not started by power-control"):
        await sched.stop_job("train", nodes=["n1"], saga_id="s")
    with pytest.raises(SchedulerError, match="no state_dir is set"):
        await ProcessScheduler({}).stop_job("train", nodes=["n1"], saga_id="s")
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (state / "train.pid").write_text(gone.stdout)
    assert "not running (its process group" in await sched.stop_job("train", nodes=["n1"], saga_id="s")


async def test_a_job_its_pid_file_shows_running_is_not_started_twice(tmp_path):
    """A job started by hand (`powerguard power job-start`) or by a power-control before its
    restart: its pid file names a running group, so a start (the outage's job_restart, or the
    command run again) says so and launches nothing; once the group exited, it starts."""
    state = tmp_path / "jobs"
    state.mkdir()
    marker = tmp_path / "started"
    argv = [sys.executable, "-c", f"open({str(marker)!r}, 'a').write('x')"]
    job = subprocess.Popen(  # noqa: ASYNC220 (the job as its first start left it)
        [sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True
    )
    try:
        (state / "train.pid").write_text(f"{job.pid}\n")
        sched = ProcessScheduler({"state_dir": str(state), "jobs": {"train": {"argv": argv}}})
        said = await sched.start_job("train", nodes=["n1"], saga_id="s")
        assert said == f"job train already running (process group {job.pid}, {state}/train.pid)", said
        assert (state / "train.pid").read_text().split()[0] == str(job.pid) and not marker.exists()
    finally:
        job.kill()
        job.wait()
    said = await sched.start_job("train", nodes=["n1"], saga_id="s")  # its group gone: started
    assert said.startswith("started job train"), said
    sched.procs["train"].wait(30)
    assert marker.read_text() == "x"


async def test_an_adopted_job_that_exits_on_sigterm_is_stopped_at_once_though_its_parent_never_reaps_it(tmp_path):
    """A job another process launched (a previous power-control, the demo's site) whose parent
    does not reap it: its leader is a zombie once it exits, and the stop must see it gone at once,
    not wait out ``stop_timeout_s`` of battery (``killpg(pgid, 0)`` answers for zombies)."""
    job = subprocess.Popen(  # noqa: ASYNC220 (a stand-in launcher that never reaps its job)
        [sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True
    )
    try:
        state = tmp_path / "jobs"
        state.mkdir()
        (state / "train.pid").write_text(f"{job.pid}\n")
        sched = ProcessScheduler({"stop_timeout_s": 20, "state_dir": str(state)})  # not its launcher: adopts it
        t = time.monotonic()
        said = await sched.stop_job("train", nodes=["n1"], saga_id="s")
        took = time.monotonic() - t
        assert psutil.Process(job.pid).status() == psutil.STATUS_ZOMBIE  # nobody reaped it meanwhile
        assert said.startswith("stopped job train") and took < 5, (said, took)
    finally:
        job.kill()
        job.wait()


async def test_command_hook_gets_saga_job_and_node_in_its_environment(make_bus, tmp_path, monkeypatch):
    seen = tmp_path / "hook.log"
    hook = [
        sys.executable,
        "-c",
        f"import os; open({str(seen)!r}, 'a').write(' '.join(os.environ[k] for k in "
        "('POWERGUARD_ACTION', 'POWERGUARD_SAGA', 'POWERGUARD_JOB', 'POWERGUARD_NODES')) + '\\n')",
    ]
    cfg = site([{"name": "n1"}], scheduler={"kind": "command", "options": {"stop": hook, "start": hook, "drain": hook}})
    bus = await make_bus("power-control")
    rec = await Recorder().start(bus)
    pc = await service(bus, cfg)
    try:
        await outage(bus, rec, "n1", "train")
        await restore(bus, rec, "n1", "train")
        lines = seen.read_text().splitlines()
        assert lines[0].split() == ["drain", "saga-1", "n1"]  # no job for a drain: the field is empty
        assert lines[1].split() == ["stop", "saga-1", "train", "n1"]
        assert lines[2].split() == ["start", "saga-1", "train", "n1"]
    finally:
        await pc.stop()


async def test_a_job_on_two_nodes_is_stopped_once(make_bus, tmp_path):
    """The saga stops a job with one command for all its nodes, and each node's shutdown names
    the job too: the shutdowns wait for that stop instead of stopping the job again."""
    seen = tmp_path / "hook.log"
    hook = [sys.executable, "-c", f"import os; open({str(seen)!r}, 'a').write(os.environ['POWERGUARD_ACTION'] + '\\n')"]
    cfg = site([{"name": "n1"}, {"name": "n2"}], scheduler={"kind": "command", "options": {"stop": hook}})
    bus = await make_bus("power-control")
    rec = await Recorder().start(bus)
    pc = await service(bus, cfg)
    try:
        await bus.publish(shutdown("n1", jobs=["train"]))
        await bus.publish(shutdown("n2", jobs=["train"]))
        await bus.publish(job_cmd(JobStopRequested, "train", ["n1", "n2"]))
        await rec.wait(lambda: all("off" in rec.states(n) for n in ("n1", "n2")), what="both nodes off")
    finally:
        await pc.stop()
    assert seen.read_text().splitlines() == ["stop"], "the job was stopped more than once"
    assert rec.of(JobStopped, job="train") and not rec.of(PowerActionFailed)


async def test_failing_hook_is_reported_and_the_node_still_goes_down(make_bus, make_bmc, monkeypatch):
    cred = creds(monkeypatch)
    bmc = make_bmc("n1", soft_off_delay=0.1)
    cfg = site([bmc_node("n1", bmc, cred)], scheduler={"kind": "command", "options": {"drain": ["false"]}})
    bus = await make_bus("power-control")
    rec = await Recorder().start(bus)
    pc = await service(bus, cfg)
    try:
        await outage(bus, rec, "n1", "train")
        failed = rec.of(PowerActionFailed, action="job_stop")
        assert failed and "exited 1" in failed[0].data.error
        assert bmc.power == "off"
    finally:
        await pc.stop()
    assert os.environ.get("POWERGUARD_JOB") is None  # hooks get their env, ours is untouched


LAUNCHER = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a launcher that does not stop in time
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
open(sys.argv[1], "w").write(str(worker.pid))
time.sleep(600)
"""


@pytest.mark.parametrize("adopted", [False, True])
async def test_a_job_killed_after_its_stop_timeout_leaves_no_worker_behind(tmp_path, adopted):
    """A launcher that does not stop on SIGTERM is killed after ``stop_timeout_s``; its workers
    in their own sessions (torchrun starts every rank so) are killed with it, not left training
    on orphaned. Both for a job this power-control started and one it adopted from a pid file."""
    worker_file = tmp_path / "worker.pid"
    argv = [sys.executable, "-c", LAUNCHER, str(worker_file)]
    state = tmp_path / "jobs"
    launched = None
    if adopted:
        state.mkdir()
        launched = subprocess.Popen(argv, start_new_session=True)  # noqa: ASYNC220 (a previous launcher)
        (state / "train.pid").write_text(f"{launched.pid}\n")
        sched = ProcessScheduler({"stop_timeout_s": 1, "state_dir": str(state)})
    else:
        sched = ProcessScheduler({"stop_timeout_s": 1, "jobs": {"train": {"argv": argv}}})
        await sched.start_job("train", nodes=["n1"], saga_id="s")
    worker = None
    try:
        pid = await eventually(lambda: worker_file.exists() and worker_file.read_text().strip(), what="the worker")
        worker = psutil.Process(int(pid))
        said = await sched.stop_job("train", nodes=["n1"], saga_id="s")
        assert said.startswith("killed job train"), said
        worker.wait(10)  # gone (psutil.TimeoutExpired if it still runs)
    finally:
        if worker is not None and worker.is_running():
            worker.kill()
        if launched is not None:
            launched.kill()
            launched.wait()
