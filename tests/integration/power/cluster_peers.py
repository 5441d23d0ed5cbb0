"""Real Slurm (munge + slurmctld + slurmd on loopback, one node) and a real dockerd, for the
scheduler adapter tests. Both need root; the fixtures skip (fail under CI=true) without it."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import subprocess
import tarfile
from pathlib import Path

from powerguard.bus import free_ports
from tests.conftest import require_binary
from tests.waiting import eventually_sync

from .peers import _spawn, stop


class Slurm:
    def __init__(self, tmp: Path) -> None:
        self.slurmctld = require_binary("slurmctld", "slurm-wlm")
        self.slurmd = require_binary("slurmd", "slurm-wlm")
        self.munged = require_binary("munged", "munge")
        self.tmp = tmp
        self.node = socket.gethostname().split(".")[0]
        self.ctl_port, self.d_port = free_ports(2)
        for d in ("state", "spool", "log", "munge"):
            (tmp / d).mkdir(exist_ok=True)
        self.conf = tmp / "slurm.conf"
        self.conf.write_text(
            f"ClusterName=pgtest\nSlurmctldHost={self.node}(127.0.0.1)\nSlurmctldPort={self.ctl_port}\n"
            f"SlurmdPort={self.d_port}\nSlurmUser=root\nSlurmdUser=root\nAuthType=auth/munge\n"
            f"StateSaveLocation={tmp / 'state'}\nSlurmdSpoolDir={tmp / 'spool'}\n"
            f"SlurmctldPidFile={tmp / 'slurmctld.pid'}\nSlurmdPidFile={tmp / 'slurmd.pid'}\n"
            "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nReturnToService=2\nMpiDefault=none\n"
            "SchedulerType=sched/backfill\nSelectType=select/cons_tres\nSelectTypeParameters=CR_Core\n"
            "JobCompType=jobcomp/none\nAccountingStorageType=accounting_storage/none\n"
            "SlurmctldTimeout=30\nSlurmdTimeout=30\nInactiveLimit=0\nMinJobAge=300\nKillWait=5\n"
            "JobRequeue=1\n"
            f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} State=UNKNOWN\n"
            f"PartitionName=main Nodes={self.node} Default=YES MaxTime=INFINITE State=UP\n"
        )
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.procs: list[subprocess.Popen] = []
        self.munge_socket = Path("/run/munge/munge.socket.2")

    def _munge(self) -> None:
        if self.munge_socket.exists() and subprocess.run(["munge", "-n"], capture_output=True).returncode == 0:
            return  # a munged already runs on this machine
        run = Path("/run/munge")
        run.mkdir(parents=True, exist_ok=True)
        munge = pwd.getpwnam("munge")
        os.chown(run, munge.pw_uid, munge.pw_gid)
        key = Path("/etc/munge/munge.key")
        if not key.exists():
            subprocess.run(["mungekey", "--create", "--keyfile", str(key)], check=True)
            os.chown(key, munge.pw_uid, munge.pw_gid)
        subprocess.run(["runuser", "-u", "munge", "--", self.munged], check=True)
        eventually_sync(lambda: subprocess.run(["munge", "-n"], capture_output=True).returncode == 0, 10, "munged")

    def cmd(self, *argv: str, check: bool = True) -> str:
        r = subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=30)
        if check and r.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {r.stderr.strip()}")
        return r.stdout

    def node_state(self) -> str:
        return self.cmd("sinfo", "-h", "-n", self.node, "-o", "%T").strip()

    def start(self) -> Slurm:
        if os.geteuid() != 0:
            raise RuntimeError("Slurm tests need root (slurmd runs jobs as root here)")
        self._munge()
        self.procs.append(
            _spawn(
                [self.slurmctld, "-D", "-i", "-f", str(self.conf)],
                self.tmp / "log" / "ctld.log",
                env={"SLURM_CONF": str(self.conf)},
            )
        )
        self.procs.append(
            _spawn(
                [self.slurmd, "-D", "-f", str(self.conf)],
                self.tmp / "log" / "slurmd.log",
                env={"SLURM_CONF": str(self.conf)},
            )
        )

        def idle() -> bool:
            try:
                return self.node_state() == "idle"
            except (RuntimeError, subprocess.TimeoutExpired):
                return False

        log = self.tmp / "log" / "ctld.log"
        eventually_sync(idle, 30, "the Slurm node idle", every=0.3, details=lambda: log.read_text()[-1500:])
        return self

    def stop(self) -> None:
        for p in reversed(self.procs):
            stop(p)


class Dockerd:
    """dockerd on its own socket and data root, and a busybox image imported from a rootfs."""

    IMAGE = "powerguard-test/busybox:1"

    def __init__(self, tmp: Path) -> None:
        self.dockerd = require_binary("dockerd", "docker.io")
        self.busybox = require_binary("busybox", "busybox-static")
        self.tmp = tmp
        self.root = Path(os.environ.get("POWERGUARD_DOCKER_ROOT", "/var/tmp/powerguard-dockerd"))
        self.sock = self.root / "docker.sock"
        self.proc: subprocess.Popen | None = None

    @property
    def host(self) -> str:
        return f"unix://{self.sock}"

    def client(self):
        import docker

        return docker.DockerClient(base_url=self.host, timeout=60)

    def start(self) -> Dockerd:
        if os.geteuid() != 0:
            raise RuntimeError("dockerd needs root")
        self.root.mkdir(parents=True, exist_ok=True)
        pid = self.root / "docker.pid"
        pid.unlink(missing_ok=True)  # stale after a SIGKILL
        self.sock.unlink(missing_ok=True)
        self.proc = _spawn(
            [
                self.dockerd,
                "--data-root",
                str(self.root / "data"),
                "--exec-root",
                str(self.root / "exec"),
                "-H",
                self.host,
                "--pidfile",
                str(pid),
                "--iptables=false",
                "--bridge=none",
            ],
            self.tmp / "dockerd.log",
        )
        log = self.tmp / "dockerd.log"

        def pings() -> bool:
            try:
                return bool(self.client().ping())
            except Exception:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"dockerd exited: {log.read_text()[-1500:]}") from None
                return False

        eventually_sync(pings, 30, "dockerd to answer", every=0.2, details=lambda: log.read_text()[-1500:])
        self._image()
        return self

    def _image(self) -> None:
        c = self.client()
        if any(self.IMAGE in (i.tags or []) for i in c.images.list()):
            return
        rootfs = self.tmp / "rootfs"
        (rootfs / "bin").mkdir(parents=True)
        shutil.copy(self.busybox, rootfs / "bin" / "busybox")
        for tool in ("sh", "sleep", "echo", "cat", "date", "trap"):
            (rootfs / "bin" / tool).symlink_to("busybox")
        tar = self.tmp / "rootfs.tar"
        with tarfile.open(tar, "w") as t:
            t.add(rootfs, arcname=".")
        repo, tag = self.IMAGE.split(":")
        c.api.import_image(src=str(tar), repository=repo, tag=tag)

    def stop(self) -> None:
        try:
            c = self.client()
            for ct in c.containers.list(all=True, filters={"label": "powerguard.test"}):
                ct.remove(force=True)
        except Exception:
            pass
        stop(self.proc)


def docker_state(client, name: str) -> dict:
    return json.loads(json.dumps(client.containers.get(name).attrs["State"]))
