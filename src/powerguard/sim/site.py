"""The simulated site of the demo, all on loopback and pip-only: an embedded nats-server, a
UPS and a switched PDU as SNMP agents (pysnmp), one IPMI BMC per node (pyghmi, own process),
an OTLP receiver for every process's spans, the site YAML, and the three services
(ups-monitor, coordinator, power-control) as their own processes. The training job (ckpt-agent
in every rank) is launched by power-control's ``process`` scheduler adapter.

With ``blackout`` the site can lose all its power, PowerGuard's own included: the UPS obeys
UPS-MIB's upsControl group (its output goes off when told and on again when mains returns),
the coordinator may tell it (``ups_off``), and the broker's store and the checkpoint disks
live on power-cut filesystems (:mod:`.powercut_fs`) where FUSE can be mounted.
:meth:`SimSite.power_lost` is the moment the output goes off: every process is SIGKILLed and
what no one made durable is gone; :meth:`SimSite.power_returned` boots the site again (the
PDU's outlets on, each BMC by its restore policy, the broker on what it kept) and
:meth:`SimSite.start_services` starts the services, as their supervisor would at boot."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from powerguard.bus import EmbeddedNats, embedded_cluster
from powerguard.bus.embedded import with_parent
from powerguard.bus.roles import SERVICES

from .errors import DrillError
from .kube_site import KubeSite
from .otlp import OtlpReceiver
from .pdu import SimPdu
from .powercut import PowerCutFs, unavailable
from .ups import Battery, Output, ups_agent

# what the simulated site waits on purpose (the drill benchmark subtracts these from its timings)
BOOT_DELAY_S = 1.0
RESTORE_STABLE_S = 2.0
OUTLET_STAGGER_S = 1.0
SECRETS = {
    "PG_DEMO_SNMP_COMMUNITY": "public",
    "PG_DEMO_PDU_COMMUNITY": "private",
    "PG_DEMO_BMC_USER": "admin",
    "PG_DEMO_BMC_PASSWORD": "demo-bmc-pw",
    "PG_DEMO_UPS_WRITE_COMMUNITY": "ups-private",
}
UPS_OUTPUT_STARTUP_S = 1.0  # the UPS turns its output on this long after mains returns (auto restart)


def _faketime() -> str:
    """libfaketime (Debian's ``libfaketime``), to run one process with its clock off."""
    for d in ("/usr/lib/x86_64-linux-gnu/faketime", "/usr/lib/aarch64-linux-gnu/faketime", "/usr/lib/faketime"):
        lib = Path(d) / "libfaketimeMT.so.1"
        if lib.exists():
            return str(lib)
    raise RuntimeError("a clock offset needs libfaketime: apt-get install libfaketime")


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


TRAIN_MODULES = {
    "": "powerguard.sim.train",
    "lightning": "powerguard.sim.train_lightning",
    "hf": "powerguard.sim.train_hf",
}


@dataclass
class SiteOptions:
    nodes: int = 2
    ranks_per_node: int = 2
    steps: int = 300
    seed: int = 1234
    step_sleep_s: float = 0.04
    speed: float = 8.0  # the battery is this many times smaller than the SRT 6000's (drains this much faster)
    load_per_node_pct: float = 30.0  # a node whose GPUs train
    idle_load_per_node_pct: float = 8.0  # a node that is on but not training (paused, stopped, booting)
    shutdown_reserve_s: float = 36.0  # of the ~59 s a full battery lasts at the training load
    max_on_battery_s: float = 6.0  # the hold: the site shuts down after this long on battery (wall seconds)
    hold_checkpoint_every_s: float | None = None  # the coordinator's (None: its default)
    hold_checkpoint_max_share: float | None = None  # the coordinator's (None: its default)
    hold_policy: str = "checkpoint-at-stop"
    job: str = "demo-train"
    nats_nodes: int = 1  # 3: a JetStream cluster on loopback (R3 stream and buckets)
    clock_offset: dict[str, float] = field(default_factory=dict)  # service -> seconds its clock is off (libfaketime)
    ckpt_disk_mb: int = 0  # > 0: the checkpoint directory is a tmpfs this small (root only), to fill up
    local_scope: str = "node"  # each simulated node's own checkpoint disk (ckpt/<node>), or "shared"
    framework: str = ""  # "lightning" or "hf": the job trains with that framework's PowerGuard callback
    ups_driver: str = "snmp"  # "nut": Debian's upsd + dummy-ups fed with the battery's state (a real NUT server)
    blackout: bool = False  # the UPS may be told to cut its output; broker store and checkpoints on power-cut disks
    ups_off_after_s: float = 3.0  # blackout: the site limit (down on battery this long: tell the UPS)
    ups_off_delay_s: float = 3.0  # blackout: the UPS's delay between the command and its output going off
    job_command: list[str] = field(default_factory=list)  # `powerguard try`: the user's command instead of sim.train
    train_args: list[str] = field(default_factory=list)  # more flags of sim.train (both runs): an evaluation
    # `powerguard try`: the job's environment (the agent's mode); "{nats_url}" in a value: the site's broker
    job_env: dict[str, str] = field(default_factory=dict)
    kubernetes: bool = False  # the job is a JobSet on the simulated Kubernetes API server (sim/kube_site.py)


@dataclass
class SimSite:
    workdir: Path
    opts: SiteOptions = field(default_factory=SiteOptions)

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.node_names = [f"node{i + 1}" for i in range(self.opts.nodes)]
        self.bmc_state = {n: self.workdir / f"bmc-{n}.json" for n in self.node_names}
        self.battery = Battery(load=self._load, speed=self.opts.speed)
        self.pdu = SimPdu(self.opts.nodes)
        self.receiver = OtlpReceiver()
        self.nats: EmbeddedNats | None = None  # the (first) server
        self.nats_nodes: list[EmbeddedNats] = []
        self.procs: dict[str, subprocess.Popen] = {}
        self.argv: dict[str, list[str]] = {}
        self.agents: list = []
        self.progress = self.workdir / "progress.txt"
        # the job finished: sim.train's final parameters; a user's command (`try`): the launcher's mark of exit 0
        self.final = self.workdir / ("job-done" if self.opts.job_command else "final.pt")
        self.site_file = self.workdir / "site.yaml"
        self.otlp_url = ""
        self.ckpt_dir = self.workdir / "ckpt"
        self._ups_port = 0
        self.nut = None  # the NUT server (ups_driver "nut")
        self._feeding = threading.Event()
        self.output: Output | None = None  # blackout: the UPS's output (what feeds the whole site)
        self.disks: list[PowerCutFs] = []  # blackout: the broker's store and the checkpoints, on power-cut disks
        self.powercut_unavailable: str | None = None  # why the disks are plain directories (SIGKILL alone)
        self.dark = False  # the site has no power (every process dead, by design)
        self.bmc_argv: dict[str, list[str]] = {}
        self.kube = KubeSite(self.workdir, self.bmc_state, self.opts.job) if self.opts.kubernetes else None

    # ------------------------------------------------------------ the physical site
    def node_on(self, node: str) -> bool:
        try:
            return json.loads(self.bmc_state[node].read_text()).get("power") == "on"
        except (OSError, ValueError):
            return False

    def training(self) -> bool:
        """The job's ranks are computing: a step finished within the last half second."""
        try:
            return time.time() - self.progress.stat().st_mtime < 0.5
        except OSError:
            return False

    def _load(self) -> float:
        """Each powered node draws its training load while the ranks train, else its idle load."""
        per_node = self.opts.load_per_node_pct if self.training() else self.opts.idle_load_per_node_pct
        return per_node * sum(self.node_on(n) for n in self.node_names)

    def utility(self, on: bool) -> None:
        """Mains power fails (False) or returns (True)."""
        self.battery.set_on_battery(not on)

    @property
    def nats_url(self) -> str:
        return ",".join(n.url for n in self.nats_nodes)

    # ------------------------------------------------------------ faults
    async def stream_leader(self, timeout_s: float = 20.0) -> EmbeddedNats:
        """The server that leads the event stream (a cluster's; the only one otherwise). A cluster
        that is electing one answers late or not at all: asked again until ``timeout_s``."""
        import asyncio

        from powerguard.bus import Bus, BusNames

        named = {f"n{i}": n for i, n in enumerate(self.nats_nodes)}  # embedded_cluster's server names
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                bus = await Bus.connect(self.nats_url, service="sim-probe", names=BusNames(), setup=False)
                try:
                    info = await bus.js.stream_info(bus.names.stream)
                finally:
                    await bus.close()
                leader = info.cluster.leader if info.cluster else None
                if leader in named or len(self.nats_nodes) == 1:
                    return named.get(leader or "", self.nats_nodes[0])
            except Exception:
                if time.monotonic() > deadline:
                    raise
            if time.monotonic() > deadline:
                return self.nats_nodes[0]
            await asyncio.sleep(0.5)

    def ups_garbage(self, on: bool) -> None:
        """The UPS's agent answers with out-of-range values (charge 255 %, load 999 %) or, again, sane ones."""
        self.battery.garbage = on

    async def ups_silent(self, seconds: float) -> None:
        """The UPS's agent stops answering for ``seconds`` (then comes back on its port)."""
        import asyncio

        ups = self.agents[0]
        ups.stop()
        await asyncio.sleep(seconds)
        self.agents[0] = self._ups_agent()
        await self.agents[0].start("127.0.0.1", self._ups_port)

    def _ups_agent(self):
        if self.output is None:
            return ups_agent(self.battery)
        return ups_agent(self.battery, output=self.output, write_community=SECRETS["PG_DEMO_UPS_WRITE_COMMUNITY"])

    def fill_ckpt_disk(self) -> None:
        """Fill the checkpoint filesystem (``ckpt_disk_mb``) to the last byte."""
        ballast = self.ckpt_dir / ".ballast"
        with contextlib.suppress(OSError), open(ballast, "ab") as f:
            block = b"\0" * (1 << 16)
            while True:
                f.write(block)
                f.flush()

    def free_ckpt_disk(self) -> None:
        (self.ckpt_dir / ".ballast").unlink(missing_ok=True)

    # ------------------------------------------------------------ lifecycle
    async def _start_nats(self) -> None:
        if self.opts.nats_nodes > 1:
            self.nats_nodes = embedded_cluster(self.workdir / "nats", self.opts.nats_nodes)
        else:
            self.nats_nodes = [EmbeddedNats(store_dir=self.workdir / "nats")]
        for n in self.nats_nodes:
            n.with_parent = True  # a demo killed hard takes its broker with it
            n.start()
        self.nats = self.nats_nodes[0]
        if len(self.nats_nodes) > 1:  # the services start once JetStream has a meta leader; R3 streams now
            import asyncio

            from powerguard.bus import Bus, BusNames
            from powerguard.bus.names import StreamLimits

            deadline = time.monotonic() + 30
            while True:
                try:
                    bus = await Bus.connect(
                        self.nats_url, service="sim-setup", names=BusNames(), limits=StreamLimits(replicas=3)
                    )
                    await bus.close()
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.5)

    def _mount_ckpt_disk(self) -> None:
        self.ckpt_dir.mkdir(parents=True, exist_ok=True)
        if self.opts.ckpt_disk_mb > 0:
            subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={self.opts.ckpt_disk_mb}m", "pg-ckpt", str(self.ckpt_dir)],
                check=True,
                capture_output=True,
            )

    def _mount_powercut_disks(self) -> None:
        """Blackout: the broker's store (journal mode: the metadata of ext4/XFS, which nats-server
        needs) and the checkpoint disks (POSIX's promises alone) on power-cut filesystems."""
        self.powercut_unavailable = unavailable()
        if self.powercut_unavailable is not None:
            return
        self.disks = [
            PowerCutFs(self.workdir / "disk-nats", self.workdir / "nats", mode="journal").start(),
            PowerCutFs(self.workdir / "disk-ckpt", self.ckpt_dir, mode="posix").start(),
        ]

    async def start(self) -> None:
        if self.opts.blackout:
            if self.opts.nats_nodes > 1 or self.opts.ckpt_disk_mb or self.opts.ups_driver != "snmp":
                raise ValueError("blackout runs with one broker, the SNMP UPS and no checkpoint tmpfs")
            self.output = Output(mains=lambda: not self.battery.on_battery, startup_delay_s=UPS_OUTPUT_STARTUP_S)
            self._mount_powercut_disks()
        await self._start_nats()
        self._mount_ckpt_disk()
        self.otlp_url = await self.receiver.start()
        ups = self._ups_agent()
        ups_port = self._ups_port = await ups.start()
        pdu = self.pdu.agent()
        pdu_port = await pdu.start()
        self.agents = [ups, pdu]
        if self.opts.ups_driver == "nut":
            self._start_nut()
        bmc_ports = {}
        pw = self.workdir / "bmc.pw"
        pw.write_text(SECRETS["PG_DEMO_BMC_PASSWORD"])
        for n in self.node_names:
            bmc_ports[n] = _free_udp_port()
            self.bmc_state[n].write_text(json.dumps({"power": "on", "policy": 2, "changes": 0}))
            self.bmc_argv[n] = [
                sys.executable,
                "-m",
                "powerguard.sim.bmc",
                "--port",
                str(bmc_ports[n]),
                "--user",
                SECRETS["PG_DEMO_BMC_USER"],
                "--password-file",
                str(pw),
                "--state",
                str(self.bmc_state[n]),
                "--boot-delay",
                str(BOOT_DELAY_S),
                "--soft-off-delay",
                "0.5",
            ]
            self._spawn(f"bmc-{n}", self.bmc_argv[n])
        if self.kube is not None:
            self._spawn("kube-apiserver", self.kube.argv())
            await self._kube_listening(30.0)
        self.site_file.write_text(yaml.safe_dump(self._site(ups_port, pdu_port, bmc_ports), sort_keys=False))
        self.start_services()

    async def _kube_listening(self, within_s: float) -> None:
        log, proc = self.workdir / "kube-apiserver.log", self.procs["kube-apiserver"]
        deadline = time.monotonic() + within_s
        while "listening on" not in log.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace")[-1500:]
                raise DrillError(f"the simulated Kubernetes API server did not start within {within_s:.0f}s:\n{tail}")
            await asyncio.sleep(0.1)

    def start_services(self) -> None:
        """ups-monitor, the coordinator and power-control, each its own process."""
        for svc in SERVICES:
            self._spawn(
                svc,
                [
                    sys.executable,
                    "-m",
                    f"powerguard.{svc.replace('-', '_')}",
                    "--config",
                    str(self.site_file),
                    "--nats-url",
                    self.nats_url,
                    "--http-port",
                    "0",
                ],
            )

    def _start_nut(self) -> None:
        """A real NUT server whose UPS follows the battery: ups-monitor polls upsd, as on a site."""
        from .nut import NutUps

        (self.workdir / "nut").mkdir(exist_ok=True)
        self.nut = NutUps(self.workdir / "nut", ups="ups-a").start()
        self._feed_once()
        self._feeding.set()
        threading.Thread(target=self._feed_loop, name="nut-feed", daemon=True).start()

    def _feed_once(self) -> None:
        b = self.battery
        self.nut.feed(
            on_battery=b.on_battery,
            charge_pct=b.charge_pct,
            runtime_s=b.runtime_s,
            load_pct=b.total_load(),
            low=b.low,
            fsd=b.fsd and b.on_battery,
        )

    def _feed_loop(self) -> None:
        while self._feeding.is_set():
            with contextlib.suppress(OSError):
                self._feed_once()
            time.sleep(0.2)

    def _env(self, service: str) -> dict[str, str]:
        env = {
            **os.environ,
            **SECRETS,
            "OTEL_EXPORTER_OTLP_ENDPOINT": self.otlp_url,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_BSP_SCHEDULE_DELAY": "200",
            "OTEL_SERVICE_NAME": f"powerguard-{service}",
            "PYTHONUNBUFFERED": "1",
        }
        if len(self.nats_nodes) > 1:
            env["POWERGUARD_NATS_REPLICAS"] = str(len(self.nats_nodes))
        offset = self.opts.clock_offset.get(service)
        if offset:  # this process's wall clock is off; its monotonic clock is not (as with a bad NTP)
            env.update(LD_PRELOAD=_faketime(), FAKETIME=f"{offset:+.0f}s", FAKETIME_DONT_FAKE_MONOTONIC="1")
        return env

    def _spawn(self, name: str, argv: list[str]) -> None:
        self.argv[name] = argv
        log = open(self.workdir / f"{name}.log", "ab")
        self.procs[name] = subprocess.Popen(  # each its own group; ends with this process even if it is killed
            with_parent(argv), stdout=log, stderr=subprocess.STDOUT, env=self._env(name), start_new_session=True
        )
        log.close()

    async def start_job(self) -> str:
        """Start the training job with the site file's process adapter (what power-control uses
        to stop and restart it: the same pid file)."""
        from powerguard.power_control.config import PowerControlSettings
        from powerguard.power_control.schedulers import make_scheduler
        from powerguard.schemas import load_site

        if self.kube is not None:  # a JobSet in Kueue's queue: the simulated cluster runs its pods
            local = self.ckpt_dir / "{node}" if self.opts.local_scope == "node" else self.ckpt_dir
            argv = self._train_argv(out=self.final, local_dir=local, nats=True)
            return await asyncio.to_thread(self.kube.start_job, argv, self.opts.ranks_per_node)
        settings = load_site(self.site_file).settings("power_control", PowerControlSettings)
        self._launcher = make_scheduler(settings.scheduler)
        return await self._launcher.start_job(self.opts.job, nodes=self.node_names, saga_id="demo-start")

    def job_pid(self) -> int | None:
        """The training job's launcher's pid (power-control's process adapter's pid file), if any."""
        try:
            return int((self.workdir / "jobs" / f"{self.opts.job}.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def job_running(self) -> bool:
        """The training job's launcher (started by power-control's process adapter) is alive;
        on Kubernetes, a pod of its JobSet is pending or running."""
        if self.kube is not None:
            return self.kube.job_running()
        if (pid := self.job_pid()) is None:
            return False
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        try:  # a zombie is not running (power-control reaps it only when it next looks)
            return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except (OSError, IndexError):
            return False

    def kill(self, name: str) -> None:
        """SIGKILL a process of the site (a crash, a power loss of its host)."""
        p = self.procs[name]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()

    def respawn(self, name: str) -> None:
        """Start a killed process again, as a supervisor (systemd, Kubernetes) would."""
        self._spawn(name, self.argv[name])

    def management_host_lost(self) -> None:
        """The management host loses power: the broker (every node of it) and the three services
        die at once (SIGKILL); the compute nodes, their BMCs and the training job run on."""
        for name in SERVICES:
            if name in self.procs:
                self.kill(name)
        for n in self.nats_nodes:
            n.kill()

    def management_host_back(self) -> None:
        """The management host boots: the broker on its disk (what it fsynced), then the services."""
        for n in self.nats_nodes:
            n.start()
        self.start_services()

    def dead(self) -> list[str]:
        """Processes of the site that died (a service crash shows up here; none while the site is dark)."""
        if self.dark:
            return []
        return [n for n, p in self.procs.items() if p.poll() is not None]

    def _train_argv(self, *, out: Path, local_dir: Path, nats: bool) -> list[str]:
        o = self.opts
        argv = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(o.nodes * o.ranks_per_node),
            "-m",
            TRAIN_MODULES[o.framework],
            "--job",
            o.job,
            "--steps",
            str(o.steps),
            "--seed",
            str(o.seed),
            "--local-dir",
            str(local_dir),
            "--out",
            str(out),
            "--step-sleep",
            str(o.step_sleep_s),
            *o.train_args,
        ]
        if nats:
            assert self.nats is not None
            if not o.framework:  # a framework's checkpoints live in one shared directory
                argv += ["--local-scope", o.local_scope]
            argv += [
                "--nats-url",
                self.nats_url,
                "--nodes",
                ",".join(self.node_names),
                "--progress",
                str(self.progress),
            ]
        return argv

    def reference_run(self, timeout_s: float = 300.0) -> Path:
        """The same job with the same seed, uninterrupted and without the bus: the bit-exact reference.

        With ``POWERGUARD_REFERENCE_CACHE`` set (a directory; the test suite sets one per session),
        a reference already trained there with the same command line (paths aside), the same
        training module and the same torch is copied instead of trained again: the drills of one
        suite share a job, and its reference cost each of them about a quarter of its time. Meant
        for one run of a suite (the code it runs is the same throughout), never a site's drill."""
        out = self.workdir / "reference.pt"
        argv = self._train_argv(out=out, local_dir=self.workdir / "ckpt-reference", nats=False)
        argv[argv.index("--step-sleep") + 1] = "0"
        if "--eval-log" in argv:  # its own: the drill waits for the outage run's ranks in the site's log
            argv[argv.index("--eval-log") + 1] = str(self.workdir / "reference-eval.txt")
        cached = _reference_cache(argv)
        if cached is not None and cached.exists():
            shutil.copyfile(cached, out)
            return out
        self._train_reference(argv, timeout_s)
        if cached is not None:
            tmp = cached.with_name(f"{cached.name}.{os.getpid()}.tmp")
            shutil.copyfile(out, tmp)
            os.replace(tmp, cached)
        return out

    def _train_reference(self, argv: list[str], timeout_s: float) -> None:
        with open(self.workdir / "reference.log", "ab") as log:
            subprocess.run(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                timeout=timeout_s,
                check=True,
            )

    def _site(self, ups_port: int, pdu_port: int, bmc_ports: dict[str, int]) -> dict:
        o = self.opts
        launch = [sys.executable, "-m", "powerguard.sim.launch"]
        for n in self.node_names:
            launch += ["--node-state", str(self.bmc_state[n])]
        local = self.ckpt_dir / "{node}" if o.local_scope == "node" and not o.framework else self.ckpt_dir
        if o.job_command:
            job_argv = [*launch, "--done", str(self.final), "--", *o.job_command]
        else:
            job_argv = [*launch, "--", *self._train_argv(out=self.final, local_dir=local, nats=True)]
        cred = {"username": {"env": "PG_DEMO_BMC_USER"}, "password": {"env": "PG_DEMO_BMC_PASSWORD"}}
        ups = {
            "name": "ups-a",
            "driver": "snmp",
            "host": "127.0.0.1",
            "port": ups_port,
            "options": {"community": {"env": "PG_DEMO_SNMP_COMMUNITY"}, "profile": "apc"},
        }
        if self.nut is not None:
            ups = {"name": "ups-a", "driver": "nut", "host": "127.0.0.1", "port": self.nut.port}
        blackout = {}
        if o.blackout:  # the last step of an outage longer than the battery (UPS-MIB upsControl)
            ups["control"] = {"options": {"community": {"env": "PG_DEMO_UPS_WRITE_COMMUNITY"}}}
            blackout = {
                "ups_off": True,
                "ups_off_after_s": o.ups_off_after_s,
                "ups_off_delay_s": o.ups_off_delay_s,
                "ups_off_return_s": 1.0,
            }
        return {
            "site": "demo",
            "ups": [ups],
            "pdus": [
                {
                    "name": "pdu-a",
                    "host": "127.0.0.1",
                    "port": pdu_port,
                    "options": {"community": {"env": "PG_DEMO_PDU_COMMUNITY"}},
                }
            ],
            "nodes": [
                {
                    "name": n,
                    "feeds": ["ups-a"],
                    "outlets": [{"pdu": "pdu-a", "outlet": i + 1}],
                    "bmc": {"driver": "ipmi", "host": "127.0.0.1", "port": bmc_ports[n], **cred},
                }
                for i, n in enumerate(self.node_names)
            ],
            "ups_monitor": {"poll_interval_s": 0.25, "status_every_s": 0.5, "timeout_s": 1.0, "comm_timeout_s": 5.0},
            "coordinator": {
                "ckpt_timeout_s": 60,
                "shutdown_reserve_s": o.shutdown_reserve_s,
                "margin_s": 5,
                "restore_stable_s": RESTORE_STABLE_S,
                "min_restart_charge_pct": 20,
                "tick_s": 0.1,
                "shutdown_timeout_s": 60,
                "restore_timeout_s": 150,
                "max_on_battery_s": o.max_on_battery_s,
                "hold_policy": o.hold_policy,
                **{
                    k: v
                    for k, v in (
                        ("hold_checkpoint_every_s", o.hold_checkpoint_every_s),
                        ("hold_checkpoint_max_share", o.hold_checkpoint_max_share),
                    )
                    if v is not None
                },
                **blackout,
            },
            "power_control": {
                "soft_off_timeout_s": 5,
                "boot_timeout_s": 40,
                "outlet_stagger_s": OUTLET_STAGGER_S,
                "max_parallel_power_on": 1,
                "gather_s": 0.3,
                "poll_interval_s": 0.2,
                "device_timeout_s": 5,
                "outlets_off_on_shutdown": True,
                "scheduler": self.kube.scheduler()
                if self.kube is not None
                else {
                    "kind": "process",
                    "options": {
                        "stop_timeout_s": 30,
                        "state_dir": str(self.workdir / "jobs"),
                        "jobs": {
                            o.job: {
                                "argv": job_argv,
                                "log": str(self.workdir / "job.log"),
                                **({"cwd": os.getcwd()} if o.job_command else {}),  # `try`: where the user ran it
                                "env": {
                                    **{k: v for k, v in self._env("ckpt-agent").items() if k.startswith("OTEL_")},
                                    **{k: v.replace("{nats_url}", self.nats_url) for k, v in o.job_env.items()},
                                },
                            }
                        },
                    },
                },
            },
        }

    # ------------------------------------------------------------ a blackout
    def power_lost(self) -> None:
        """The UPS's output is off: the whole site loses power at once. Every process dies
        (SIGKILL: no shutdown, no flush), the power-cut disks drop what was not durable, the
        PDU's outlets are dead (as their PDU)."""
        self.dark = True
        for d in self.disks:  # the disks stop first: nothing written after this instant lands
            if d.proc is not None and d.proc.poll() is None:
                os.killpg(d.proc.pid, signal.SIGKILL)
        self._kill_job()
        for name in list(self.procs):
            self.kill(name)
        for n in self.nats_nodes:
            n.kill()
        for d in self.disks:
            d.cut()
        for outlet in self.pdu.state:
            self.pdu.switch(outlet, False)

    def _kill_job(self) -> None:
        """SIGKILL the training job's launcher and every process below it (torchrun's workers
        may sit in other process groups)."""
        from .launch import descendants

        if (pid := self.job_pid()) is None:
            return
        with contextlib.suppress(OSError):
            for p in [pid, *descendants(pid)]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p, signal.SIGKILL)

    def power_returned(self) -> None:
        """The UPS's output is on again: the PDU switches its outlets on (its own power-on
        behaviour), the disks come back with what was durable, the broker starts on it, each
        BMC starts and its node boots by its restore policy (always-on here, as `powerguard
        power audit --fix` sets it). The services are :meth:`start_services`'s."""
        for outlet in self.pdu.state:
            self.pdu.switch(outlet, True)
        for d in self.disks:
            d.start()
        for n in self.nats_nodes:
            n.start()
        for n in self.node_names:
            self._spawn(f"bmc-{n}", [*self.bmc_argv[n], "--ac-restored"])
        self.dark = False

    async def stop(self) -> None:
        if (job := self.job_pid()) is not None:  # a job still running (a failed drill): stop it with the site
            with contextlib.suppress(OSError):
                os.killpg(job, signal.SIGKILL)
        for name in reversed(list(self.procs)):
            p = self.procs[name]
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        # waited for off the event loop: a service exports its last spans on the way out to the
        # OTLP receiver, which runs on this loop (a blocked loop held each export for its 10 s
        # timeout, and lost the spans)
        await asyncio.to_thread(self._reap, list(self.procs.values()), 15.0)
        for a in self.agents:
            a.stop()
        self._feeding.clear()
        if self.nut is not None:
            self.nut.stop()
        await self.receiver.stop()
        for n in self.nats_nodes:
            n.stop()
        self._unmount_ckpt_disk()
        for d in self.disks:
            d.stop()

    @staticmethod
    def _reap(procs: list[subprocess.Popen], within_s: float) -> None:
        """Wait for ``procs`` (told to stop) together for ``within_s``; SIGKILL what is left."""
        deadline = time.monotonic() + within_s
        for p in procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()

    def _unmount_ckpt_disk(self) -> None:
        if self.opts.ckpt_disk_mb > 0:
            subprocess.run(["umount", "-l", str(self.ckpt_dir)], check=False, capture_output=True)


def _reference_cache(argv: list[str]) -> Path | None:
    """Where a reference of this command line is kept (``POWERGUARD_REFERENCE_CACHE``), or None."""
    root = os.environ.get("POWERGUARD_REFERENCE_CACHE")
    if not root:
        return None
    import importlib.util

    import torch

    paths = {"--out", "--local-dir", "--eval-log"}  # where it writes, not what it trains
    key = [a for i, a in enumerate(argv[1:], 1) if argv[i - 1] not in paths]
    module = argv[argv.index("-m", argv.index("--nproc-per-node")) + 1]
    spec = importlib.util.find_spec(module)
    source = Path(spec.origin).read_bytes() if spec and spec.origin else b""
    blob = json.dumps([key, torch.__version__]).encode() + hashlib.sha256(source).digest()
    digest = hashlib.sha256(blob).hexdigest()[:24]
    Path(root).mkdir(parents=True, exist_ok=True)
    return Path(root) / f"reference-{digest}.pt"
