"""Side by side, in the same run, on the same UPS: NUT's own ``upsmon`` (default POLLFREQ 5 s /
POLLFREQALERT 5 s, NOTIFYCMD time-stamping ONBATT) against PowerGuard's ups-monitor (default
1 s poll), both watching one real ``upsd`` + ``dummy-ups``. Time from the UPS going on battery
(as upsd first reports it) to the first notification of each. Writes
bench/results/upsmon_side_by_side.json. Needs nut-server and nut-client (as the tests do)."""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _provenance import write  # noqa: E402

from powerguard.bus import Bus, BusNames, EmbeddedNats  # noqa: E402
from powerguard.schemas import OnBattery, OnLine, SiteConfig  # noqa: E402
from powerguard.ups_monitor.config import MonitorSettings  # noqa: E402
from powerguard.ups_monitor.service import Monitor  # noqa: E402
from tests.integration.ups.nut_peer import NutServer  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "upsmon_side_by_side.json"
CYCLES = 8
UPSMON = "/lib/nut/upsmon"


def start_upsmon(tmp: Path, port: int) -> tuple[subprocess.Popen, Path]:
    notify_log = tmp / "notify.log"
    script = tmp / "notify.sh"
    script.write_text(f'#!/bin/sh\necho "$(date +%s.%N) $NOTIFYTYPE $*" >> {notify_log}\n')
    script.chmod(0o755)
    conf = tmp / "upsmon.conf"
    conf.write_text(
        f"MONITOR ups1@127.0.0.1:{port} 1 monitor mon primary\n"
        'MINSUPPLIES 1\nSHUTDOWNCMD "/bin/true"\nRUN_AS_USER root\n'
        f"NOTIFYCMD {script}\nNOTIFYFLAG ONBATT EXEC\nNOTIFYFLAG ONLINE EXEC\n"
        f"POWERDOWNFLAG {tmp / 'killpower'}\n"  # POLLFREQ and POLLFREQALERT left at their defaults (5 s)
    )
    conf.chmod(0o600)
    env = {**os.environ, "NUT_CONFPATH": str(tmp), "NUT_STATEPATH": str(tmp), "NUT_ALTPIDPATH": str(tmp)}
    log = open(tmp / "upsmon.log", "ab")
    proc = subprocess.Popen([UPSMON, "-F", "-p"], env=env, stdout=log, stderr=log, start_new_session=True)
    return proc, notify_log


def notifications(path: Path, kind: str) -> list[float]:
    if not path.exists():
        return []
    return [float(line.split()[0]) for line in path.read_text().splitlines() if line.split()[1:2] == [kind]]


async def run(cycles: int) -> dict:
    results: dict = {"cycles": cycles}
    with tempfile.TemporaryDirectory() as tmp, EmbeddedNats(store_dir=Path(tmp) / "nats") as server:
        tmp = Path(tmp)
        (tmp / "nut").mkdir()
        (tmp / "upsmon").mkdir()
        nut = NutServer(tmp / "nut").start()
        upsmon, notify_log = start_upsmon(tmp / "upsmon", nut.port)
        bus = await Bus.connect(server.url, service="bench", names=BusNames.isolated("side"))
        cfg = SiteConfig(
            site="bench",
            ups=[{"name": "nut1", "driver": "nut", "port": nut.port, "options": {"ups_name": "ups1"}}],
            nodes=[{"name": "n1", "feeds": ["nut1"]}],
        )
        stop = asyncio.Event()
        monitor = Monitor(bus, cfg, settings=MonitorSettings(status_every_s=3600), instance="bench")  # 1 s poll
        task = asyncio.create_task(monitor.run(stop))
        await asyncio.sleep(7)  # upsmon's first poll and login
        ours: list[float] = []
        theirs: list[float] = []
        rng = random.Random(3)
        try:
            async with bus.subscribe(OnBattery, OnLine, deliver="new") as sub:
                await sub.start()
                for _ in range(cycles):
                    for ob in (True, False):
                        await asyncio.sleep(rng.uniform(0.5, 5.5))  # a random phase of both poll clocks
                        want = "OB DISCHRG" if ob else "OL CHRG"
                        kind = "ONBATT" if ob else "ONLINE"
                        before = len(notifications(notify_log, kind))
                        await asyncio.to_thread(nut.set_status, want)
                        while want not in await asyncio.to_thread(nut.command, "GET VAR ups1 ups.status"):
                            await asyncio.sleep(0.001)
                        t0 = time.time()
                        while True:
                            ev = await asyncio.wait_for(sub.__anext__(), 15)
                            if ev.data.on_battery == ob:
                                break
                        t_ours = time.time()
                        deadline = time.monotonic() + 20
                        while len(notifications(notify_log, kind)) <= before and time.monotonic() < deadline:
                            await asyncio.sleep(0.01)
                        got = notifications(notify_log, kind)
                        if ob and len(got) > before:
                            ours.append(t_ours - t0)
                            theirs.append(got[before] - t0)
        finally:
            stop.set()
            await asyncio.wait_for(task, 10)
            upsmon.terminate()
            upsmon.wait(10)
            nut.stop()
            await bus.close()

    def stats(xs: list[float]) -> dict:
        xs = sorted(xs)
        return {
            "p50_ms": round(xs[len(xs) // 2] * 1000, 1),
            "max_ms": round(xs[-1] * 1000, 1),
            "n": len(xs),
            "samples_ms": [round(x * 1000, 1) for x in xs],
        }

    if not ours:
        sys.exit(f"upsmon sent no ONBATT notification; see {tmp}/upsmon/upsmon.log")
    results["upsmon"] = {"config": "POLLFREQ 5, POLLFREQALERT 5 (defaults), NOTIFYCMD", **stats(theirs)}
    results["ups_monitor"] = {"config": "poll_interval_s 1 (default)", **stats(ours)}
    results["speedup_p50"] = round(results["upsmon"]["p50_ms"] / max(results["ups_monitor"]["p50_ms"], 0.1), 1)
    print(
        f"on battery -> first notification: upsmon p50 {results['upsmon']['p50_ms']} ms "
        f"(max {results['upsmon']['max_ms']}), ups-monitor p50 {results['ups_monitor']['p50_ms']} ms "
        f"(max {results['ups_monitor']['max_ms']}), n={len(ours)}"
    )
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cycles", type=int, default=CYCLES, help=f"on battery and back (default {CYCLES})")
    p.add_argument("--smoke", action="store_true", help="one cycle (CI: the benchmark runs)")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    if not os.path.exists(UPSMON):
        sys.exit("upsmon not found: apt-get install nut-client")
    write(asyncio.run(run(1 if args.smoke else args.cycles)), args.out)


if __name__ == "__main__":
    main()
