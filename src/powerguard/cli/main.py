"""``powerguard``: operator and developer commands."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from powerguard.bus import BusError, BusNames
from powerguard.schemas import PowerGuardError

from ._conn import CA, CONFIG, CREDS, EPILOG, URL, target
from ._extras import require_agent
from .demo import run_demo

app = typer.Typer(
    rich_markup_mode=None,
    name="powerguard",
    help="PowerGuard: outage-safe GPU training. Monitor UPSes, checkpoint every rank, shut down, restore.",
    no_args_is_help=True,
    add_completion=False,
)
schemas_app = typer.Typer(
    rich_markup_mode=None, help="The event contract: JSON Schema and AsyncAPI.", no_args_is_help=True
)
app.add_typer(schemas_app, name="schemas")


def _version(show: bool) -> None:
    if show:
        from powerguard.bus.version import version

        print(f"powerguard {version()}")
        raise typer.Exit()


@app.callback()
def _root(
    show_version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the installed release and exit"
    ),
) -> None:
    """PowerGuard: outage-safe GPU training. Monitor UPSes, checkpoint every rank, shut down, restore."""


from .backup import backup as backup_cmd  # noqa: E402
from .backup import restore as restore_cmd  # noqa: E402
from .ckpt_key import ckpt_key_app  # noqa: E402
from .config import config_app  # noqa: E402
from .creds import bootstrap, creds_app  # noqa: E402
from .power import power_app  # noqa: E402

app.add_typer(power_app, name="power")
app.add_typer(creds_app, name="creds")
app.add_typer(config_app, name="config")
app.add_typer(ckpt_key_app, name="ckpt-key")
app.command("bootstrap", epilog=EPILOG)(bootstrap)
app.command("backup", epilog=EPILOG)(backup_cmd)
app.command("restore", epilog=EPILOG)(restore_cmd)

from .resume_check import check_resume  # noqa: E402
from .try_job import HELP as TRY_HELP  # noqa: E402
from .try_job import try_job  # noqa: E402

app.command("check-resume")(check_resume)
app.command("try", help=TRY_HELP)(try_job)

err = Console(stderr=True)
READERS = ("observer", "operator", "admin")


def _fail(exc: BaseException) -> typer.Exit:
    err.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
    return typer.Exit(1)


@app.command(epilog=EPILOG)
def tail(
    subject: str = typer.Argument(None, help="Subject filter, e.g. 'pg.power.>' (default: every event, '<prefix>.>')"),
    config: Path = CONFIG,
    url: str = URL,
    creds: Path = CREDS,
    ca: Path = CA,
    count: int = typer.Option(0, "--count", "-n", min=0, help="Exit after N events (0: run until Ctrl-C)"),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per line: subject, trace_id, event"),
    prefix: str = typer.Option(None, help="Subject prefix of the deployment (default: the site file's, else pg)"),
    stream: str = typer.Option(None, help="JetStream stream holding the events (default: the site file's)"),
    from_start: bool = typer.Option(False, "--all", help="Replay the stream from its start, not only new events"),
) -> None:
    """Print events from the bus as they arrive: type, subject, time, trace id (the observer's or the
    operator's credential)."""
    try:
        t = target(config, url, creds, ca)
        t.require(*READERS, command="powerguard tail")
        names = t.names
        if prefix or stream:
            names = BusNames(prefix=prefix or names.prefix, stream=stream or names.stream)
        asyncio.run(_tail(t, names, subject or names.subjects.all, count, as_json, from_start))
    except (BusError, PowerGuardError) as exc:
        raise _fail(exc) from None
    except TimeoutError:
        raise _fail(
            TimeoutError(
                "the server did not answer the stream's subscription: is this credential allowed to "
                "read the event stream (observer or operator)? Is the stream bootstrapped?"
            )
        ) from None
    except KeyboardInterrupt:
        pass


async def _tail(t, names: BusNames, subject: str, count: int, as_json: bool, from_start: bool) -> None:
    from powerguard.bus import Bus
    from powerguard.bus.client import redact

    url = t.url
    out = Console(highlight=False, soft_wrap=True)
    bus = await Bus.connect(url, service="tail", names=names, setup=False, **t.auth)

    def bad(subj: str, payload: bytes, exc: Exception) -> None:
        err.print(f"[yellow]undecodable message on {subj}:[/yellow] {exc}")

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, stop.set)
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    sub = bus.subscribe(subject=subject, deliver="all" if from_start else "new", on_error=bad)
    try:
        await sub.start()
        err.print(f"tail: listening on {subject} at {redact(url)}", style="dim")
        seen = 0
        while not stop.is_set() and (count == 0 or seen < count):
            nxt = asyncio.create_task(sub.next_received())
            stopper = asyncio.create_task(stop.wait())
            done, _ = await asyncio.wait({nxt, stopper}, return_when=asyncio.FIRST_COMPLETED)
            stopper.cancel()
            if nxt not in done:
                nxt.cancel()
                break
            rec = nxt.result()
            seen += 1
            if as_json:
                line = {
                    "subject": rec.subject,
                    "trace_id": rec.trace_id,
                    "event": rec.event.model_dump(mode="json", exclude_none=True),
                }
                sys.stdout.write(json.dumps(line) + "\n")
                sys.stdout.flush()
            else:
                ev = rec.event
                out.print(
                    f"[dim]{ev.time:%H:%M:%S.%f}[/dim] [bold]{ev.short_type}[/bold] "
                    f"[cyan]{rec.subject}[/cyan] trace={rec.trace_id or '-'} "
                    f"{ev.data.model_dump_json(exclude_none=True)}"
                )
    finally:
        await sub.aclose()
        await bus.close()


@app.command()
def nats(
    port: int = typer.Option(4222, help="Client port (0: pick a free one)"),
    host: str = typer.Option("127.0.0.1", help="Listen address"),
    store_dir: Path = typer.Option(Path(".powerguard/nats"), help="JetStream state directory (kept)"),
) -> None:
    """Run an embedded nats-server with JetStream in the foreground (Ctrl-C stops it)."""
    from powerguard.bus import EmbeddedNats

    store_dir.mkdir(parents=True, exist_ok=True)
    server = EmbeddedNats(port=port or None, host=host, store_dir=store_dir)
    try:
        server.start()
    except BusError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from None
    err.print(f"nats-server (JetStream) at {server.url}, state in {store_dir}, pid {server.pid}; Ctrl-C to stop")

    def _stop(*_: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _stop)
    try:
        server.proc.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


def _work_lost(row: dict) -> str:
    """Steps lost at the stop per job ("≥" where the stop step comes from heartbeats). A drill
    stops nothing: what a real outage would have lost is shown as such, never as work lost."""
    parts = []
    for job, f in sorted(row["jobs"].items()):
        if f["lost_steps"] is not None:
            n = f"{'≥' if f['lost_steps_at_least'] else ''}{f['lost_steps']}"
            parts.append(f"{job}: would lose {n} (drill)" if row.get("drill") else f"{job}: {n} ({f['hold_policy']})")
        elif f["final_checkpoint"]:
            parts.append(f"{job}: ? ({f['final_checkpoint']})")
    return "; ".join(parts) or "-"


@app.command(epilog=EPILOG)
def status(
    config: Path = CONFIG,
    url: str = URL,
    creds: Path = CREDS,
    ca: Path = CA,
    show_all: bool = typer.Option(False, "--all", help="Also list finished sagas"),
    as_json: bool = typer.Option(False, "--json", help="JSON instead of a table"),
) -> None:
    """Show open outage sagas: state, acks received/expected, checkpoint budget left."""

    from powerguard.bus import Bus
    from powerguard.bus.saga_status import saga_statuses

    async def fetch() -> list[dict]:
        t = target(config, url, creds, ca)
        t.require(*READERS, command="powerguard status")
        bus = await Bus.connect(t.url, service="status", names=t.names, setup=False, **t.auth)
        try:
            now = time.time()
            return [s.row(now) for s in await saga_statuses(bus, include_closed=show_all)]
        finally:
            await bus.close()

    try:
        rows = asyncio.run(fetch())
    except (BusError, PowerGuardError) as exc:
        raise _fail(exc) from None
    except TimeoutError:
        raise _fail(TimeoutError("the server did not answer: is this credential allowed to read pg_status?")) from None
    if as_json:
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return
    if not rows:
        err.print("no open sagas" if not show_all else "no sagas")
        return
    Console().print(status_view(rows, Console().width))
    for r in rows:  # the last step of an outage longer than the battery, per UPS told
        for ups, what in (r.get("ups_off") or {}).items():
            Console().print(f"{r['saga']}: UPS {ups} {what}")


STATUS_COLUMNS = (
    "state",
    "acks",
    "budget left",
    "on battery",
    "at risk",
    "hold",
    "work lost",
    "restore",
    "age",
    "reason",
)
WIDE_STATUS = 140  # narrower terminals get one block per saga: a table of 11 columns is unreadable


def _status_cells(r: dict) -> list[str]:
    budget = "-" if r["budget_left_s"] is None else f"{r['budget_left_s']:.0f}s"
    return [
        r["state"] + (" (drill)" if r.get("drill") else ""),
        r["acks"],
        budget,
        ",".join(r["ups_on_battery"]),
        ",".join(r["nodes_at_risk"]),
        "-" if r["hold_s"] is None else f"{r['hold_s']:.0f}s",
        _work_lost(r),
        _restore_cell(r.get("restore")),
        f"{r['age_s']:.0f}s",
        r["reason"] or "",
    ]


def status_view(rows: list[dict], width: int):
    """The sagas as one table on a wide terminal, else one block per saga (field, value): the
    saga id is never shortened (it is copied into `tail`, the console, the trace)."""
    from rich.console import Group
    from rich.table import Table

    if width >= WIDE_STATUS:
        table = Table(title="outage sagas")
        table.add_column("saga", no_wrap=True, min_width=max(len(r["saga"]) for r in rows))
        for col in STATUS_COLUMNS:
            table.add_column(col)
        for r in rows:
            table.add_row(r["saga"], *_status_cells(r))
        return table
    blocks = []
    for r in rows:
        t = Table(title=f"saga {r['saga']}", show_header=False, title_justify="left", expand=False)
        t.add_column("field", style="bold", no_wrap=True)
        t.add_column("value", overflow="fold")
        for col, value in zip(STATUS_COLUMNS, _status_cells(r), strict=True):
            if value and value != "-":
                t.add_row(col, value)
        blocks.append(t)
    return Group(*blocks)


def _restore_cell(r: dict | None) -> str:
    if not r:
        return "-"
    cell = f"{r['ready']}/{r['asked']} ready"
    if r["in_ramp"]:
        cell += f", {r['in_ramp']} in the ramp ({r['ramp']})"
    return cell


@schemas_app.command("export")
def schemas_export(directory: Path = typer.Argument(..., help="Output directory")) -> None:
    """Write asyncapi.yaml, events.md and one <type>.schema.json per event type."""
    from powerguard.schemas.export import export

    paths = export(directory)
    err.print(f"wrote {len(paths)} files to {directory}")


@app.command()
def demo(
    flap: bool = typer.Option(False, "--flap", help="Power returns before any shutdown: the saga is cancelled"),
    race: bool = typer.Option(False, "--race", help="Power returns while the nodes shut down: shutdown, then restore"),
    real_ups: bool = typer.Option(
        False,
        "--real-ups",
        help="A real NUT server (Debian's upsd + dummy-ups) instead of the simulated SNMP UPS, on a fresh site "
        "(no outage measured before): the UPS's runtime estimate drops from 600 s to 100 s, below the 120 s "
        "shutdown reserve, and its load jumps; the final checkpoint is still taken (needs nut-server)",
    ),
    fsd: bool = typer.Option(
        False,
        "--fsd",
        help="The same real NUT server orders a forced shutdown (FSD) 10 s into the hold: no time for a final "
        "checkpoint; the job stops on its newest hold checkpoint (every 4 s here), and the drill checks that no "
        "more than that was lost (needs nut-server)",
    ),
    evaluation: bool = typer.Option(
        False,
        "--eval",
        help="The utility fails while the job runs a 20 s evaluation (inside guard.quiescent()): the power "
        "checkpoint is taken at once, of the last step's state, not after the evaluation",
    ),
    blackout: bool = typer.Option(
        False,
        "--blackout",
        help="The outage outlasts the battery: once the nodes are off the coordinator tells the UPS to cut its "
        "output; the whole site loses power, broker and services included (SIGKILL; the broker's store and the "
        "checkpoints on a power-cut filesystem, which drops what was not durable, where FUSE mounts); mains "
        "returns and the site comes back by itself",
    ),
    kubernetes: bool = typer.Option(
        False,
        "--kubernetes",
        help="The job runs as a JobSet in Kueue on a simulated Kubernetes API server (one pod per node): "
        "power-control's kubernetes adapter taints the nodes and holds admission on battery, suspends the "
        "workload only after every rank acked, and resumes it after the restore (the outage scenario only)",
    ),
    seed: int = typer.Option(1234, "--seed", help="Training seed (the reference run uses the same)"),
    steps: int = typer.Option(300, "--steps", min=60, help="Training steps of the job"),
    hold_policy: str = typer.Option(
        "checkpoint-at-stop",
        "--hold-policy",
        help="What the job does during the hold: checkpoint-at-stop (train on, final checkpoint before the "
        "shutdown), pause (wait after the checkpoint until power returns or the stop), continue (train on; the "
        "hold's work is lost at the stop, and the drill says so)",
    ),
    framework: str = typer.Option(
        "",
        "--framework",
        help="Train the job with PyTorch Lightning (lightning) or the Hugging Face Trainer (hf) and PowerGuard's "
        "callback, instead of a plain PyTorch loop (needs powerguard-ckpt-agent[lightning] or [hf])",
    ),
    keep_console: bool = typer.Option(
        False, "--console", help="Keep the operator console open after the drill (until Ctrl-C)"
    ),
    console_port: int = typer.Option(0, "--console-port", help="The operator console's port (0: a free one)"),
    json_out: Path = typer.Option(None, "--json", help="Write the report here; trace and timeline go next to it"),
    workdir: Path = typer.Option(None, "--workdir", help="Keep the site's files (logs, checkpoints) here"),
) -> None:
    """Run a whole outage drill on this machine: embedded NATS, simulated UPS/PDU/BMCs, real services,
    a 2-node x 2-rank training job; checks bit-exact resume against a reference run."""
    require_agent("demo")
    chosen = {"flap": flap, "race": race, "real-ups": real_ups, "fsd": fsd, "eval": evaluation, "blackout": blackout}
    if sum(chosen.values()) > 1:
        err.print("[red]error:[/red] --flap, --race, --real-ups, --fsd, --eval and --blackout are different scenarios")
        raise typer.Exit(2)
    scenario = next((name for name, on in chosen.items() if on), "outage")
    if kubernetes and (scenario != "outage" or framework):
        err.print("[red]error:[/red] --kubernetes runs the outage scenario with the plain PyTorch job")
        raise typer.Exit(2)
    from powerguard.schemas import HOLD_POLICIES
    from powerguard.sim.drill import DrillError

    if hold_policy not in HOLD_POLICIES:
        err.print(f"[red]error:[/red] --hold-policy must be one of {', '.join(HOLD_POLICIES)}")
        raise typer.Exit(2)
    if framework not in ("", "lightning", "hf"):
        err.print("[red]error:[/red] --framework must be lightning or hf")
        raise typer.Exit(2)
    try:
        report = asyncio.run(
            run_demo(
                Console(),
                scenario=scenario,
                seed=seed,
                steps=steps,
                hold_policy=hold_policy,
                framework=framework,
                kubernetes=kubernetes,
                console_port=console_port,
                keep_console=keep_console,
                json_out=json_out,
                workdir=workdir,
                keep=workdir is not None,
            )
        )
    except (BusError, PowerGuardError, DrillError) as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from None
    # continue loses the hold's work by design: the drill reports it, it is not a failed check
    ok = report["bit_exact"] and (report["rpo_steps"] == 0 or hold_policy == "continue")
    if scenario == "fsd":  # no time for a final checkpoint: at most the hold checkpoints' interval is lost
        from .demo import FSD_HOLD_CHECKPOINT_EVERY_S

        lost_s = report["work"]["lost_s"]
        ok = report["bit_exact"] and lost_s is not None and lost_s <= FSD_HOLD_CHECKPOINT_EVERY_S + 1.0
    ok = ok and not report.get("checkpoint_failures")  # a request a rank did not answer in time
    if scenario == "flap":
        ok = ok and report["nodes_powered_off"] == 0 and "cancelled" in report["saga_states"]
    else:
        ok = ok and report["training_resumed_s"] is not None
    if scenario == "blackout":  # the saga finished after the power came back, by itself
        ok = ok and report["saga_states"][-1:] == ["done"] and report["mains_to_first_step_s"] is not None
    if not ok:
        err.print("[red]the drill did not meet its checks[/red] (see the table above)")
        raise typer.Exit(1)


@app.command(epilog=EPILOG)
def console(
    config: Path = typer.Option(
        None, "--config", "-c", "--site", help="Site YAML: NATS names, UPS list, shutdown reserve (--site: the same)"
    ),
    url: str = URL,
    creds: Path = typer.Option(None, "--creds", help="NATS credential (the observer's; env NATS_CREDS)"),
    ca: Path = CA,
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind (default loopback only)"),
    port: int = typer.Option(8080, "--port", help="Port (0: pick a free one)"),
    token_file: Path = typer.Option(
        None, "--token-file", help="Require this token: 'Authorization: Bearer' or basic auth with it as password"
    ),
    tls_cert: Path = typer.Option(None, "--tls-cert", help="Serve HTTPS with this certificate (PEM)"),
    tls_key: Path = typer.Option(None, "--tls-key", help="... and this key"),
    trace_url: str = typer.Option(
        None, "--trace-url", help="Link trace ids, e.g. http://jaeger:16686/trace/{trace_id}"
    ),
    allow_host: list[str] = typer.Option(
        [],
        "--allow-host",
        metavar="HOST",
        help="A host name browsers use to reach the console (repeatable); requests naming any other Host or "
        "Origin are refused (DNS rebinding). Loopback names and --host are always allowed",
    ),
) -> None:
    """Serve the operator console: a read-only live web page of the site (UPSes, nodes, jobs, the open
    outage with acks and its deadline, past outages). Publishes nothing on the bus."""
    from .console import run_console

    if host not in ("127.0.0.1", "::1", "localhost") and token_file is None and tls_cert is None:
        err.print(
            f"[yellow]warning:[/yellow] serving on {host} without --token-file or TLS: "
            "anyone who reaches it sees the site"
        )
    token = token_file.read_text().strip() if token_file else None
    if token_file is not None and not token:
        err.print(f"[red]error:[/red] {token_file} is empty")
        raise typer.Exit(2)
    try:
        t = target(config, url, creds, ca)
        t.require(*READERS, command="powerguard console")
    except PowerGuardError as exc:  # the site file or the credential: exit 2, the unit does not restart
        err.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        raise typer.Exit(2) from None
    try:
        asyncio.run(
            run_console(
                t,
                host=host,
                port=port,
                token=token,
                tls_cert=str(tls_cert) if tls_cert else None,
                tls_key=str(tls_key) if tls_key else None,
                trace_url=trace_url,
                allowed_hosts=tuple(allow_host),
            )
        )
    except (BusError, PowerGuardError, OSError) as exc:
        raise _fail(exc) from None


@app.command(epilog=EPILOG)
def drill(
    site: Path = typer.Option(..., "--site", "--config", "-c", help="Site YAML of the site to drill"),
    ups: str = typer.Option(..., "--ups", help="The UPS whose outage is simulated"),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Required: every power and job command is dry-run (power-control only logs them)"
    ),
    url: str = URL,
    creds: Path = typer.Option(None, "--creds", help="NATS credential: the operator's (env NATS_CREDS)"),
    ca: Path = CA,
    runtime_s: float = typer.Option(None, "--runtime-s", help="Battery runtime to start from (default: last reading)"),
    speed: float = typer.Option(1.0, "--speed", min=0.01, help="UPS seconds drained per second (10: ten times faster)"),
    timeout_s: float = typer.Option(900.0, "--timeout", help="Give up after this long"),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON"),
) -> None:
    """Drill a real site's outage path: synthetic on-battery, real saga and real checkpoint acks,
    power-control in dry-run; prints the plan as executed and a battery budget check."""
    from rich.table import Table

    from powerguard.bus import Bus
    from powerguard.ops.site_drill import run_site_drill

    if not dry_run:
        err.print(
            "[red]error:[/red] a drill runs with --dry-run only (a real outage test powers nodes off: "
            "use the UPS's own self-test for that)"
        )
        raise typer.Exit(2)
    console = Console()

    async def go():
        t = target(site, url, creds, ca)
        t.require("operator", "admin", command="powerguard drill")
        bus = await Bus.connect(t.url, service="drill", names=t.names, setup=False, **t.auth)
        try:
            return await run_site_drill(
                bus,
                t.site,
                ups,
                runtime_s=runtime_s,
                speed=speed,
                timeout_s=timeout_s,
                notify=lambda at, text: console.print(f"{at:7.2f}s  {text}") if not as_json else None,
            )
        finally:
            await bus.close()

    try:
        result = asyncio.run(go())
    except (BusError, PowerGuardError, TimeoutError) as exc:
        raise _fail(exc) from None
    if as_json:
        sys.stdout.write(json.dumps(result.as_dict(), indent=2) + "\n")
    else:
        table = Table(title=f"drill of {ups}: budget check")
        table.add_column("figure")
        table.add_column("value", justify="right")
        slowest = result.slowest_s
        for k, v in (
            ("battery runtime at drill start", f"{result.runtime_s:.0f} s at load {result.load_pct or '?'} %"),
            (
                "checkpoint budget (min(ckpt_timeout, runtime - shutdown need - margin))",
                "-" if result.budget_s is None else f"{result.budget_s:.1f} s",
            ),
            ("slowest job's checkpoint (last rank durable)", "-" if slowest is None else f"{slowest:.2f} s"),
            ("ranks acked / expected", f"{sum(map(len, result.acks.values()))} / {sum(result.expected.values())}"),
            ("shutdown decided after", "-" if result.shutdown_at_s is None else f"{result.shutdown_at_s:.1f} s"),
            (
                "commands (all dry-run)",
                str(len(result.commands)) if not result.not_dry else f"[red]{len(result.not_dry)} NOT dry-run[/red]",
            ),
            ("saga", " -> ".join(result.states)),
            ("verdict", "[green]OK[/green]" if result.ok else "[red]NOT OK[/red]"),
        ):
            table.add_row(k, v)
        console.print(table)
        for line in result.problems:
            console.print(f"[red]NOT OK:[/red] {escape(line)}", highlight=False)
    if not result.ok:
        raise typer.Exit(1)


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
