"""The simulated site's hardware on its own, for the compose ``sim`` profile and for trying the
services against something that speaks the real protocols:

    python -m powerguard.sim.serve --ups-port 1161 --pdu-port 1162 --bmc node1:1623 --bmc node2:1624 \\
        --bmc-password-file /run/secrets/bmc_password --http-port 8080

A UPS (UPS-MIB + APC PowerNet over SNMP v2c, community ``public``; battery drained by the load of
the nodes that are on), a switched APC PDU (write community from ``--pdu-community-file``), one
IPMI BMC per node (pyghmi, user ``admin``). ``POST /utility`` with ``{"on": false}`` cuts mains
power, ``{"on": true}`` restores it; ``GET /state`` shows UPS, outlets and node power.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path

from aiohttp import web

from .pdu import SimPdu
from .ups import Battery, ups_agent


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m powerguard.sim.serve", description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="0.0.0.0", help="address of every simulated device (default 0.0.0.0)")
    p.add_argument("--ups-port", type=int, default=1161, help="the UPS's SNMP agent, UDP (default 1161)")
    p.add_argument("--pdu-port", type=int, default=1162, help="the switched PDU's SNMP agent, UDP (default 1162)")
    p.add_argument("--pdu-community-file", type=Path, help="write community (default 'private')")
    p.add_argument("--bmc", action="append", default=[], metavar="NODE:PORT", help="one simulated BMC per node")
    p.add_argument("--bmc-password-file", type=Path, required=True, help="the BMCs' IPMI password (user admin)")
    p.add_argument(
        "--state-dir", type=Path, default=Path("/tmp/powerguard-sim"), help="the nodes' power states (JSON per node)"
    )
    p.add_argument(
        "--speed",
        type=float,
        default=8.0,
        help="The battery is this many times smaller than an SRT 6000 (drains this much faster)",
    )
    p.add_argument("--load-per-node", type=float, default=30.0, help="UPS load %% each powered node adds (default 30)")
    p.add_argument(
        "--http-port",
        type=int,
        default=8080,
        help='GET /state, POST /utility {"on": false} to fail mains (default 8080)',
    )
    args = p.parse_args(argv)
    return asyncio.run(serve(args))


async def serve(args: argparse.Namespace) -> int:
    args.state_dir.mkdir(parents=True, exist_ok=True)
    nodes = dict(spec.split(":", 1) for spec in args.bmc)
    states = {n: args.state_dir / f"bmc-{n}.json" for n in nodes}

    def on(node: str) -> bool:
        try:
            return json.loads(states[node].read_text()).get("power") == "on"
        except (OSError, ValueError):
            return False

    battery = Battery(load=lambda: args.load_per_node * sum(on(n) for n in nodes), speed=args.speed)
    pdu = SimPdu(max(1, len(nodes)))
    write_community = args.pdu_community_file.read_text().strip() if args.pdu_community_file else "private"
    agents = [ups_agent(battery), pdu.agent(write_community=write_community)]
    await agents[0].start(args.host, args.ups_port)
    await agents[1].start(args.host, args.pdu_port)
    procs = []
    for node, port in nodes.items():
        if not states[node].exists():
            states[node].write_text(json.dumps({"power": "on", "policy": 2, "changes": 0}))
        procs.append(
            subprocess.Popen(  # noqa: ASYNC220 - started once, before serving
                [
                    sys.executable,
                    "-m",
                    "powerguard.sim.bmc",
                    "--port",
                    port,
                    "--user",
                    "admin",
                    "--password-file",
                    str(args.bmc_password_file),
                    "--state",
                    str(states[node]),
                    "--listen",
                    args.host,
                ]
            )
        )

    async def state(_: web.Request) -> web.Response:
        return web.json_response(
            {
                "utility_on": not battery.on_battery,
                "charge_pct": round(battery.charge_pct, 1),
                "runtime_s": round(battery.runtime_s),
                "outlets": pdu.state,
                "nodes": {n: on(n) for n in nodes},
            }
        )

    async def utility(request: web.Request) -> web.Response:
        body = await request.json()
        battery.set_on_battery(not bool(body.get("on", True)))
        return await state(request)

    app = web.Application()
    app.router.add_get("/state", state)
    app.router.add_get("/healthz", lambda _: web.Response(text="ok"))
    app.router.add_post("/utility", utility)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, args.host, args.http_port).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(
        f"simulated site: UPS snmp {args.ups_port}, PDU snmp {args.pdu_port}, BMCs {nodes}, "
        f"control http {args.http_port}",
        flush=True,
    )
    await stop.wait()
    for proc in procs:
        proc.terminate()
    for a in agents:
        a.stop()
    await runner.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
