"""docs/deploy-bare-metal.md, run as written: every ``sh`` block of the guide, in order, with the
paths under a temporary root and free ports (what an SRE would type, less the sudo). The peers are
real: NUT's upsd + dummy-ups is the UPS, the project's simulated IPMI BMCs are two nodes, the
broker is the venv's nats-server with the shipped nats-tls.conf and `powerguard creds`; the units
in packaging/systemd/ run through units.py / systemctl.py (their ExecStart=, Environment=,
EnvironmentFile=, LoadCredential=, KillMode=; useradd, chown and apt-get are no-ops).

Between the guide's steps the test checks what the guide promises: `config check` passes, then
names a top-level typo, a missing secret, a wrong credential and an unreachable BMC; /readyz is
degraded with the reason for a BMC that stops answering and for ups-monitor started with the
observer's credential; an outage on the NUT UPS shuts the nodes down; the backup is taken while
the saga is down, the broker's disk is wiped, the guide's restore brings the saga back and, when
mains returns, the restored saga powers the nodes on and finishes."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.conftest import require_binary
from tests.integration.power.peers import PASSWORD, USER, PyghmiBmc
from tests.integration.ups.nut_peer import NutServer, free_port
from tests.output import quiet
from tests.waiting import eventually_sync

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]
ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "deploy-bare-metal.md"
PORTS = ("4222", "8222", "9101", "9102", "9103", "9104", "8080")


def guide_steps() -> dict[str, str]:
    """The guide's shell blocks by their ``# step:`` name, in order."""
    steps = {}
    for block in re.findall(r"```sh\n(.*?)```", GUIDE.read_text(), re.S):
        first, _, rest = block.partition("\n")
        m = re.fullmatch(r"# step: ([\w-]+)", first.strip())
        assert m, f"every sh block of the guide names its step: {first!r}"
        steps[m[1]] = rest
    return steps


class Host:
    """The management host: a root for /opt, /etc, /var and the guide's commands run in it."""

    def __init__(self, tmp: Path) -> None:
        self.root = tmp / "host"
        self.roots = {
            "/opt/powerguard": str(self.root / "opt/powerguard"),
            "/etc/powerguard": str(self.root / "etc/powerguard"),
            "/etc/systemd/system": str(self.root / "etc/systemd/system"),
            "/var/lib/powerguard": str(self.root / "var/lib/powerguard"),
            "/var/backups": str(self.root / "var/backups"),
        }
        self.root.mkdir(parents=True)
        (self.root / "roots.json").write_text(json.dumps(self.roots))
        self.ports = {p: str(free_port()) for p in PORTS}
        self.steps = guide_steps()

    def path(self, p: str) -> Path:
        for old in sorted(self.roots, key=len, reverse=True):
            if p.startswith(old):
                return Path(self.roots[old] + p[len(old) :])
        return Path(p)

    def text(self, script: str) -> str:
        from tests.e2e.bare_metal.units import remap

        script = remap(script, self.roots)
        for port, free in self.ports.items():
            script = re.sub(rf"(?<=:){port}\b", free, script)
        return script

    def sh(self, script: str, *, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
        prelude = (
            "set -euo pipefail\n"
            f"export PATH={Path(sys.executable).parent}:$PATH\n"
            'sudo() { if [ "$1" = "-u" ]; then shift 2; fi; "$@"; }\n'  # sudo -u: one user in the test
            "useradd() { :; }\nchown() { :; }\napt-get() { :; }\n"
            f'systemctl() {{ PG_TEST_ROOT={self.root} {sys.executable} -m tests.e2e.bare_metal.systemctl "$@"; }}\n'
        )
        out = subprocess.run(
            ["bash", "-c", prelude + self.text(script)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check:
            assert out.returncode == 0, f"{script}\n--- stdout\n{out.stdout[-3000:]}\n--- stderr\n{out.stderr[-5000:]}"
        return out

    def step(self, name: str, **kw) -> subprocess.CompletedProcess:
        return self.sh(self.steps.pop(name), **kw)

    def powerguard(self, *args: str, check: bool = False) -> subprocess.CompletedProcess:
        return self.sh(" ".join(["/opt/powerguard/venv/bin/powerguard", *args]), check=check)

    def ready(self, port: str) -> tuple[int, dict]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ports[port]}/readyz", timeout=5) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())
        except OSError as exc:
            return 0, {"reason": str(exc)}

    def wait_ready(self, port: str, want: bool, contains: str = "", timeout: float = 60) -> dict:
        last: list = [None, None]

        def as_wanted() -> dict | None:
            last[:] = self.ready(port)
            code, body = last
            return body if (code == 200) == want and contains in body.get("reason", "") else None

        return eventually_sync(
            as_wanted,
            timeout,
            f"port {port}: /readyz ready={want} with {contains!r}",
            every=0.3,
            details=lambda: f"last: /readyz {last[0]} {last[1]}",
        )

    def wait_listening(self, port: str, timeout: float = 60) -> None:
        """Until the unit started on ``port`` accepts a connection (a started unit is not yet
        listening: systemd's Type=simple units are "started" when their process is)."""

        def accepts() -> bool:
            try:
                socket.create_connection(("127.0.0.1", int(self.ports[port])), timeout=2).close()
                return True
            except OSError:
                return False

        eventually_sync(accepts, timeout, f"port {port} accepting connections", every=0.3)

    def sagas(self) -> list[dict]:
        out = self.powerguard(
            "status --all --json --config /etc/powerguard/site.yaml --creds /etc/powerguard/creds/operator.creds"
        )
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout) if out.stdout.strip() else []

    def wait_saga(self, state: str, timeout: float = 90) -> dict:
        rows: list[dict] = []

        def in_state() -> dict | None:
            rows[:] = sorted((r for r in self.sagas() if not r.get("drill")), key=lambda r: r["started"])
            return rows[-1] if rows and rows[-1]["state"] == state else None

        return eventually_sync(in_state, timeout, f"a saga in {state}", every=0.5, details=lambda: f"sagas: {rows}")

    def stop_all(self) -> None:
        units = self.root / "run" / "units"
        names = [p.name.removesuffix(".pid") for p in units.glob("*.pid")] if units.exists() else []
        names.sort(key=lambda n: n == "powerguard-nats.service")  # the services first, the broker last
        if names:
            self.sh("systemctl stop " + " ".join(names), check=False)


def site_file(host: Host, nut: NutServer, bmcs: dict[str, PyghmiBmc], **extra_nodes) -> dict:
    secrets = "/etc/powerguard/secrets"
    cred = {"username": {"file": f"{secrets}/bmc.user"}, "password": {"file": f"{secrets}/bmc.password"}}
    nodes = [
        {"name": n, "feeds": ["ups-a"], "bmc": {"driver": "ipmi", "host": "127.0.0.1", "port": b.port, **cred}}
        for n, b in bmcs.items()
    ]
    return {
        "site": "dc1",
        "nats": {"url": f"tls://localhost:{host.ports['4222']}", "tls_ca": "/etc/powerguard/tls/ca.pem"},
        "ups": [
            {
                "name": "ups-a",
                "driver": "nut",
                "host": "127.0.0.1",
                "port": nut.port,
                "options": {"ups_name": nut.ups, "user": "monitor", "password": {"file": f"{secrets}/nut.password"}},
            }
        ],
        "nodes": nodes,
        "ups_monitor": {"poll_interval_s": 0.25, "status_every_s": 2, "timeout_s": 1.0, "comm_timeout_s": 5.0},
        "coordinator": {
            "ckpt_timeout_s": 10,
            "shutdown_reserve_s": 120,
            "margin_s": 2,
            "restore_stable_s": 1,
            "min_restart_charge_pct": 0,
            "tick_s": 0.2,
            "shutdown_timeout_s": 60,
            "restore_timeout_s": 120,
            "max_on_battery_s": 12,
        },
        "power_control": {
            "soft_off_timeout_s": 3,
            "boot_timeout_s": 30,
            "poll_interval_s": 0.2,
            "gather_s": 0.2,
            "device_timeout_s": 2,
            "device_check_s": 2,
            "outlet_stagger_s": 0,
            "scheduler": {
                "kind": "process",
                "options": {
                    "state_dir": "/var/lib/powerguard/jobs",
                    "stop_timeout_s": 20,
                    "jobs": {JOB: job_spec(host, bmcs)},
                },
            },
        },
    }


JOB = "llama-70b"


def job_spec(host: Host, bmcs: dict[str, PyghmiBmc]) -> dict:
    """A 2-node x 1-rank training job with the ckpt-agent (the simulated trainer; the compute nodes'
    Python, with torch), its ranks dying with their node's power (sim.launch watches the BMCs)."""
    launch = [sys.executable, "-m", "powerguard.sim.launch"]
    for b in bmcs.values():
        launch += ["--node-state", str(b.state)]
    train = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(len(bmcs))]
    train += ["-m", "powerguard.sim.train", "--job", JOB, "--steps", "1000000", "--step-sleep", "0.05"]
    train += ["--local-dir", "/var/lib/powerguard/ckpt", "--nodes", ",".join(bmcs)]
    train += ["--nats-url", f"tls://localhost:{host.ports['4222']}", "--progress", "/var/lib/powerguard/jobs/progress"]
    return {
        "argv": [*launch, "--", *train],
        "env": {"NATS_CREDS": f"/var/lib/powerguard/jobs/{JOB}.creds", "NATS_CA": "/etc/powerguard/tls/ca.pem"},
        "log": f"/var/lib/powerguard/jobs/{JOB}.log",
    }


def job_pid(host: Host) -> int | None:
    import psutil

    try:
        pid = int(host.path(f"/var/lib/powerguard/jobs/{JOB}.pid").read_text().split()[0])
        alive = psutil.Process(pid).status() != psutil.STATUS_ZOMBIE  # the test started it: a zombie when stopped
        return pid if alive else None
    except (OSError, ValueError, IndexError, psutil.NoSuchProcess):
        return None


def wait_log(path: Path, needle: str, timeout: float = 90) -> None:
    eventually_sync(
        lambda: path.exists() and needle in path.read_text(errors="replace"),
        timeout,
        f"{needle!r} in {path}",
        every=0.3,
        details=lambda: path.read_text(errors="replace")[-3000:] if path.exists() else "(no log)",
    )


def previous_release_commit() -> tuple[str, str]:
    """(version, commit) of the newest release older than this tree's VERSION
    (``packaging/releases.txt``)."""
    from packaging.version import Version

    ours = Version((ROOT / "VERSION").read_text().strip())
    rows = [line.split() for line in (ROOT / "packaging" / "releases.txt").read_text().splitlines()]
    older = sorted((Version(v), c) for v, c in (r for r in rows if r and not r[0].startswith("#")) if Version(v) < ours)
    assert older, f"packaging/releases.txt names no release older than {ours}"
    version, commit = str(older[-1][0]), older[-1][1]
    tagged = subprocess.run(  # the release's tag, where this clone has it, must be that commit
        ["git", "-C", str(ROOT), "rev-parse", "-q", "--verify", f"refs/tags/v{version}^{{commit}}"],
        capture_output=True,
        text=True,
    )
    if tagged.returncode == 0:
        assert tagged.stdout.strip() == commit, f"tag v{version} is {tagged.stdout.strip()}, releases.txt says {commit}"
    return version, commit


PREVIOUS, PREVIOUS_COMMIT = previous_release_commit()  # the release the site runs first; this tree is the upgrade


def previous_release(tmp: Path) -> Path:
    """The previous release's wheels, built from its own commit as its `make wheels` built them
    (its code, its VERSION, its constraints): the site runs that release's code first, and the
    guide's upgrade takes it to this tree's."""
    src = tmp / "previous-src"
    src.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", PREVIOUS_COMMIT], capture_output=True, timeout=120
    )
    assert archive.returncode == 0, f"release {PREVIOUS} ({PREVIOUS_COMMIT}): {archive.stderr.decode()[-2000:]}"
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive.stdout, check=True, timeout=120)
    assert (src / "VERSION").read_text().strip() == PREVIOUS
    out = tmp / "previous-wheels"
    projects = ["./schemas", "./bus", "./snmp", "./services/ups-monitor", "./services/coordinator"]
    projects += ["./services/power-control", "."]
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), *projects],
        cwd=src,
        check=True,
        capture_output=True,
        timeout=600,
    )
    shutil.copy(src / "constraints.txt", out / "constraints.txt")
    return out


def versions(host: Host) -> dict[str, str]:
    """The release each service reports on its /metrics (powerguard_build_info)."""
    out = {}
    for port in ("9101", "9102", "9103", "9104"):
        with urllib.request.urlopen(f"http://127.0.0.1:{host.ports[port]}/metrics", timeout=5) as r:
            m = re.search(r'^powerguard_build_info\{.*version="([^"]+)"', r.read().decode(), re.M)
        out[port] = m[1] if m else None
    return out


def write_site(host: Host, site: dict, name: str = "site.yaml") -> Path:
    text = host.text(yaml.safe_dump(site, sort_keys=False))
    path = host.path(f"/etc/powerguard/{name}")
    path.write_text(text)
    return path


async def test_the_guide_from_an_empty_host_to_a_drilled_site(tmp_path):
    require_binary("openssl", "openssl")
    require_binary("curl", "curl")
    host = Host(tmp_path)
    nut = NutServer(tmp_path / "nut", ups="ups-a").start()
    bmcs = {n: PyghmiBmc(tmp_path, n, boot_delay=0.3).start() for n in ("n1", "n2")}
    try:
        host.step("build", timeout=600)
        # the site starts on the previous release: this tree's wheels are the upgrade
        release = (ROOT / "VERSION").read_text().strip()
        upgrade = tmp_path / "release-wheels"
        shutil.move(ROOT / "dist" / "wheels", upgrade)
        shutil.copytree(previous_release(tmp_path), ROOT / "dist" / "wheels")
        host.step("install", timeout=600)
        assert host.powerguard("--version").stdout.strip() == f"powerguard {PREVIOUS}"
        host.step("layout")
        # the SRE's edits: the site file, its secrets, the ports of this host
        secrets = host.path("/etc/powerguard/secrets")
        for name, value in (("bmc.user", USER), ("bmc.password", PASSWORD), ("nut.password", "mon")):
            (secrets / name).write_text(value + "\n")
            (secrets / name).chmod(0o640)
        site = site_file(host, nut, bmcs)
        write_site(host, site)
        env = host.path("/etc/powerguard/powerguard.env")
        env.write_text(host.text(env.read_text()).replace("NATS_LISTEN_ADDR=0.0.0.0", "NATS_LISTEN_ADDR=127.0.0.1"))
        for port in PORTS:
            text = env.read_text()
            env.write_text(re.sub(rf"(?m)^(\w+_PORT)={port}$", rf"\g<1>={host.ports[port]}", text))
        assert f"NATS_URL=tls://localhost:{host.ports['4222']}" in env.read_text()

        host.step("tls-creds")
        host.step("check-offline")

        # config check names each problem (the files alone)
        bad = dict(site, coordinater=site["coordinator"])
        out = host.powerguard(f"config check --offline --site {write_site(host, bad, 'typo.yaml')}")
        assert (
            out.returncode == 1 and "coordinater: unknown top-level section; did you mean 'coordinator'?" in out.stdout
        )
        missing = json.loads(json.dumps(site))
        missing["nodes"][1]["bmc"]["password"] = {"file": "/etc/powerguard/secrets/n2.password"}
        out = host.powerguard(f"config check --offline --site {write_site(host, missing, 'missing.yaml')}")
        assert out.returncode == 1 and "PROBLEM secret nodes[n2].bmc.password: file:" in out.stdout, out.stdout
        out = host.powerguard(
            "config check --offline --site /etc/powerguard/site.yaml --creds-dir /etc/powerguard/creds "
            "--creds-for ups-monitor=/etc/powerguard/creds/observer.creds"
        )
        assert out.returncode == 1 and "is the observer credential, not ups-monitor's" in out.stdout, out.stdout

        host.step("start")
        for port in ("9101", "9102", "9103"):
            host.wait_ready(port, True)
        for port in ("9104", "8080"):  # the exporter and the console have no /readyz: listening is their start
            host.wait_listening(port)
        host.step("ready")
        host.step("check-online")
        dead = json.loads(json.dumps(site))
        dead["nodes"].append(dict(dead["nodes"][0], name="n3", bmc=dict(dead["nodes"][0]["bmc"], port=free_port())))
        out = host.powerguard(f"config check --site {write_site(host, dead, 'dead-bmc.yaml')} --timeout 2")
        assert out.returncode == 1 and "PROBLEM node n3: cannot be acted on: " in out.stdout, out.stdout

        # power-control degraded while a BMC does not answer, ready again when it does
        bmcs["n2"].stop()
        body = host.wait_ready("9103", False, "degraded: 1 node(s) cannot be acted on: n2: ")
        assert "n1" not in body["reason"]
        bmcs["n2"].start()
        host.wait_ready("9103", True)
        # ups-monitor started with the observer's credential: alive, not ready, and why
        dropin = host.path("/etc/systemd/system/powerguard-ups-monitor.service.d")
        dropin.mkdir(parents=True)
        (dropin / "wrong.conf").write_text(
            host.text("[Service]\nLoadCredential=nats.creds:/etc/powerguard/creds/observer.creds\n")
        )
        host.sh("systemctl restart powerguard-ups-monitor.service")
        host.wait_ready("9101", False, "cannot publish power events with its credential")
        shutil.rmtree(dropin)
        host.sh("systemctl restart powerguard-ups-monitor.service")
        host.wait_ready("9101", True)

        host.step("job-creds")
        # the process adapter's first start, as the guide says; `power job-start` is new in this
        # release and the site still runs the previous one: this tree's command starts the job
        # (the adapter's own start), which the previous release's power-control stops and restarts
        ours = str(Path(sys.executable).parent / "powerguard")
        host.sh(host.steps.pop("job-start").replace("/opt/powerguard/venv/bin/powerguard", ours))
        job_log = host.path(f"/var/lib/powerguard/jobs/{JOB}.log")
        wait_log(job_log, "fresh start at step 0")
        drill = host.steps["drill"]  # run again on the new release after the upgrade
        host.step("drill", timeout=300)

        # a real outage: the UPS on battery, the job checkpoints and trains on (checkpoint-at-stop);
        # at the site's hold limit a final checkpoint of the current step, then the nodes go down
        nut.feed(on_battery=True, charge_pct=60, runtime_s=900, load_pct=40, low=False)
        host.wait_saga("holding")
        saga = host.wait_saga("down")
        assert saga["lost_steps"] == 0, saga
        assert saga["jobs"][JOB]["final_checkpoint"].startswith("committed at step"), saga["jobs"]
        assert all(b.power == "off" for b in bmcs.values()), {n: b.power for n, b in bmcs.items()}
        assert job_pid(host) is None  # stopped by power-control before the nodes went down
        host.step("watch")

        # the backup while the saga is down; the broker's disk lost; the guide's restore
        host.step("backup")
        assert (host.path("/var/backups/powerguard/latest") / "manifest.json").exists()
        host.step("restore")
        for port in ("9101", "9102", "9103"):
            host.wait_ready(port, True)
        assert host.wait_saga("down")["saga"] == saga["saga"]  # the restored broker holds the open saga

        # mains returns: the restored saga powers the nodes on and finishes
        nut.feed(on_battery=False, charge_pct=100, runtime_s=1800, load_pct=40, low=False)
        done = host.wait_saga("done", timeout=150)
        assert done["saga"] == saga["saga"]
        assert all(b.power == "on" for b in bmcs.values())
        wait_log(job_log, "resumed at step")  # restarted by power-control, from its final checkpoint
        restarted = job_pid(host)
        assert restarted is not None

        # an upgrade restarts power-control, whose child the restarted job is: KillMode=process keeps it
        assert set(versions(host).values()) == {PREVIOUS}
        shutil.rmtree(ROOT / "dist" / "wheels")
        shutil.move(upgrade, ROOT / "dist" / "wheels")
        host.step("upgrade", timeout=600)
        for port in ("9101", "9102", "9103"):
            host.wait_ready(port, True)
        assert set(versions(host).values()) == {release}  # every service restarted on the new code
        assert host.powerguard("--version").stdout.strip() == f"powerguard {release}"
        assert job_pid(host) == restarted
        # the new release handles an outage of the job the old one restarted: its checkpoint is acked
        # (checkpoint-at-stop: the job trains on in the hold), then mains returns before the stop
        before = {r["saga"] for r in host.sagas()}
        nut.feed(on_battery=True, charge_pct=90, runtime_s=1500, load_pct=40, low=False)
        held = host.wait_saga("holding")
        assert held["saga"] not in before and held["jobs"][JOB]["checkpoint_step"] is not None, held
        nut.feed(on_battery=False, charge_pct=100, runtime_s=1800, load_pct=40, low=False)
        assert host.wait_saga("cancelled", timeout=150)["saga"] == held["saga"]  # power back before shutdown
        assert all(b.power == "on" for b in bmcs.values()) and job_pid(host) == restarted  # nothing went down
        drilled = host.sh(drill, timeout=300)  # the new release's drill report, with no asyncio traceback in it
        quiet(drilled.stdout + drilled.stderr)
        host.step("rollback", timeout=600)
        for port in ("9101", "9102", "9103"):
            host.wait_ready(port, True)
        assert set(versions(host).values()) == {PREVIOUS}
        assert job_pid(host) == restarted
        host.step("revoke")  # pushed to the running broker: the old credential refused at once, no restart
        old = host.powerguard(
            "creds check /etc/powerguard/creds/agent-llama-70b.creds --config /etc/powerguard/site.yaml"
        )
        assert old.returncode == 1 and "refused" in old.stderr, old.stderr
        new = host.powerguard(
            "creds check /etc/powerguard/creds/agent-llama-70b-new.creds --config /etc/powerguard/site.yaml"
        )
        assert new.returncode == 0, new.stderr
        assert not host.steps, f"steps of the guide the test did not run: {list(host.steps)}"
    finally:
        if (pid := job_pid(host)) is not None:  # the job and its ranks (torchrun gives each its own session)
            from powerguard.power_control.schedulers.process import job_tree

            for p in job_tree(pid):
                with contextlib.suppress(OSError):
                    os.kill(p, signal.SIGKILL)
        host.stop_all()
        for b in bmcs.values():
            b.stop()
        nut.stop()
        if os.environ.get("PG_KEEP_BARE_METAL"):
            shutil.copytree(host.root / "log", Path(os.environ["PG_KEEP_BARE_METAL"]), dirs_exist_ok=True)
