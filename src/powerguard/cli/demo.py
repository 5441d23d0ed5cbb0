"""``powerguard demo``: a whole outage, end to end, on this machine (pip only).

Starts an embedded nats-server, the simulated site (UPS and PDU as SNMP agents, one IPMI BMC
per node, a 2-node x 2-rank training job with the ckpt-agent) and the three services as their
own processes; runs the reference training (same seed, no outage) first; then the scripted
outage, printing a live timeline; at the end a summary table, a JSON report, the trace as
OTLP JSON and a Gantt picture of it (PNG and HTML) next to the report.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from powerguard.bus import Bus

COLORS = {
    "setup": "dim",
    "outage": "bold red",
    "detect": "magenta",
    "saga": "cyan",
    "checkpoint": "yellow",
    "power": "green",
    "resume": "bold blue",
}


FSD_HOLD_CHECKPOINT_EVERY_S = 4.0  # ``--fsd``: hold checkpoints this often bound what FSD may cost


def _bit_exact(final: Path, reference: Path) -> bool:
    import torch

    a, b = torch.load(final, weights_only=True), torch.load(reference, weights_only=True)
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


async def run_demo(
    console: Console,
    *,
    scenario: str = "outage",
    seed: int = 1234,
    steps: int = 300,
    hold_policy: str = "checkpoint-at-stop",
    framework: str = "",
    kubernetes: bool = False,
    console_port: int | None = 0,
    keep_console: bool = False,
    json_out: Path | None = None,
    workdir: Path | None = None,
    keep: bool = False,
) -> dict:
    from powerguard.bus import BusNames
    from powerguard.sim.drill import run_drill
    from powerguard.sim.site import SimSite, SiteOptions
    from powerguard.sim.timeline import write_html, write_png

    started = time.monotonic()
    own_dir = workdir is None
    work = workdir or Path(tempfile.mkdtemp(prefix="pg-demo-"))
    out_dir = (json_out.parent if json_out else Path.cwd() / "demo-output").resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    options = SiteOptions(seed=seed, steps=steps, hold_policy=hold_policy, framework=framework, kubernetes=kubernetes)
    if scenario in ("real-ups", "fsd"):  # a real-time battery (600 s reported) on NUT, a fresh site
        options.ups_driver, options.speed, options.shutdown_reserve_s = "nut", 1.0, 120.0
        options.max_on_battery_s = 900.0  # the UPS ends the hold, not the site's limit
        options.steps = max(steps, 450)
    if scenario == "fsd":  # a small model: its hold checkpoints may take a quarter of the hold
        options.hold_checkpoint_every_s, options.hold_checkpoint_max_share = FSD_HOLD_CHECKPOINT_EVERY_S, 0.25
    if scenario == "eval":  # one 20 s evaluation after step 50, in both runs; the outage during it
        from powerguard.sim.drill import EVAL_LOG

        options.train_args = ["--eval-at", "50", "--eval-s", "20", "--eval-log", str(work / EVAL_LOG)]
    if scenario == "blackout":  # the UPS may cut its output; broker and checkpoints on power-cut disks
        options.blackout = True
        console_port = None  # the console's broker goes dark with the site
    if framework:
        options.local_scope = "shared"  # a framework's checkpoints: one directory every rank sees
    site = SimSite(work, options)
    console.print(
        f"[bold]PowerGuard outage drill[/bold]: scenario [bold]{scenario}[/bold], hold policy "
        f"[bold]{hold_policy}[/bold], job {framework or 'plain PyTorch loop'}, seed {seed}, work dir {work}"
    )
    console.print("[dim]reference run (same seed, no outage) ...[/dim]")
    t = time.monotonic()
    reference = await asyncio.to_thread(site.reference_run)
    console.print(f"[dim]reference run done in {time.monotonic() - t:.1f}s[/dim]")
    bus: Bus | None = None
    stop_console = None
    try:
        await site.start()
        assert site.nats is not None
        console.print(f"[dim]nats {site.nats.url}, site file {site.site_file}, OTLP receiver {site.otlp_url}[/dim]")
        if scenario == "blackout":
            console.print(
                "[dim]the broker's store and the checkpoint disks are on power-cut filesystems (FUSE): "
                "what is not durable when the power goes is lost[/dim]"
                if site.disks
                else f"[yellow]no power-cut filesystem ({site.powercut_unavailable}): the blackout is SIGKILL "
                "alone, which loses nothing the page cache holds[/yellow]"
            )
        bus = await Bus.connect(site.nats.url, service="demo", names=BusNames())
        if console_port is not None:
            from powerguard.schemas import load_site

            from .console import start_console, until_interrupted

            stop_console, page = await start_console(
                url=site.nats.url, site=load_site(site.site_file), port=console_port
            )
            console.print(f"[bold]operator console: {page}[/bold]")

        def notify(at: float, phase: str, text: str) -> None:
            console.print(f"[{COLORS.get(phase, 'white')}]{at:7.2f}s  {phase:<10}  {text}[/]")

        report = await run_drill(site, scenario, notify=notify, bus=bus)
        if stop_console is not None:
            if keep_console:
                console.print(f"[bold]the drill is over; the console stays open at {page} (Ctrl-C ends it)[/bold]")
                await until_interrupted()
            stop, stop_console = stop_console, None
            await stop()  # before the site (and its NATS) goes
        report["bit_exact"] = _bit_exact(site.final, reference)
        report["seed"] = seed
        report["framework"] = framework or "torch"
        if site.kube is not None:  # what power-control did to the cluster, from the API server's audit log
            report["kubernetes"] = site.kube.report()
            for line in report["kubernetes"]["writes"]:
                console.print(f"[dim]kubernetes: {escape(line)}[/dim]")
        if scenario != "blackout":  # a blackout's drill closed this one when the broker lost power
            # closed, not drained (as `powerguard try` does): an observer has nothing to flush
            # (its publishes were acknowledged), and nats-py's drain waited its whole 30 s timeout
            # on the pull subscription of the drill's cancelled event watcher
            await bus.close()
        bus = None
        await site.stop()  # the services flush their spans on the way out
        await asyncio.sleep(0.5)
        trace_id, spans = _outage_trace(site, report)
        report["trace_id"] = trace_id
        report["span_count"] = len(spans)
        report["trace_services"] = sorted({s.service for s in spans})
        report["wall_s"] = round(time.monotonic() - started, 1)
        stem = json_out.stem if json_out else f"demo-{scenario}"
        files = {
            "trace": out_dir / f"{stem}.trace.json",
            "png": out_dir / f"{stem}.timeline.png",
            "html": out_dir / f"{stem}.timeline.html",
        }
        site.receiver.write_otlp_json(files["trace"], trace_id)
        if spans:
            title = f"PowerGuard {scenario} drill - trace {trace_id} - {len(spans)} spans"
            write_png(spans, files["png"], title)
            write_html(spans, files["html"], title)
        report["files"] = {k: str(v) for k, v in files.items()}
        if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
            sent = await site.receiver.forward(os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"])
            console.print(f"[dim]forwarded {sent} OTLP request(s) to {os.environ['OTEL_EXPORTER_OTLP_ENDPOINT']}[/dim]")
        if json_out:
            await asyncio.to_thread(json_out.write_text, json.dumps(report, indent=2) + "\n")
        _summary(console, report)
        return report
    finally:
        if stop_console is not None:  # the drill failed: still stop every process of the site below
            try:
                await stop_console()
            except Exception as exc:
                console.print(f"[yellow]the operator console did not stop cleanly: {exc!r}[/yellow]")
        if bus is not None:
            await bus.close()
        await site.stop()
        if own_dir and not keep:
            shutil.rmtree(work, ignore_errors=True)


def _outage_trace(site, report: dict) -> tuple[str | None, list]:
    """The outage's trace: the one the saga's spans live in (the on_battery event's trace)."""
    spans = site.receiver.spans
    saga = report.get("saga_id")
    ids = [s.trace_id for s in spans if saga and s.attributes.get("powerguard.saga_id") == saga]
    if not ids:
        return None, []
    trace_id = max(set(ids), key=ids.count)
    return trace_id, site.receiver.trace(trace_id)


def _summary(console: Console, r: dict) -> None:
    def s(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f} s"

    w, b, sg = r.get("work") or {}, r.get("battery_at_stop") or {}, r.get("saga") or {}

    def n(v) -> str:
        return "-" if v is None else str(v)

    lost = w.get("lost_steps")
    lost_txt = f"{lost} steps" + (f" ({w['lost_s']:.2f} s of training)" if lost and w.get("lost_s") else "")
    lost_txt = f"[green]{lost_txt}[/green]" if lost == 0 else f"[red]{lost_txt}[/red]"
    table = Table(title=f"outage drill: {r['scenario']}, hold policy {r.get('hold_policy')}")
    table.add_column("figure")
    table.add_column("value", justify="right")
    rows = [
        ("utility failure -> detected (on_battery on the bus)", s(r["detected_s"])),
        ("utility failure -> every rank's checkpoint durable", s(r["all_acked_s"])),
        ("utility failure -> every node off", s(r["nodes_off_s"])),
        ("utility return -> every node powered on and ready", s(r["power_restored_s"])),
        ("utility return -> training resumed", s(r["training_resumed_s"])),
        ("saga", " -> ".join(r["saga_states"])),
        ("nodes powered off", str(r["nodes_powered_off"])),
        (
            "step at detection / power checkpoint / final checkpoint / stop / restored",
            f"{r['step_at_detection']} / {n(r['checkpoint_step'])} / {n(r.get('final_checkpoint_step'))} / "
            f"{n(w.get('stop_step'))} / {n(r['restored_step'])}",
        ),
        ("hold (saga: holding -> stop decided)", s(sg.get("hold_s"))),
        (
            "steps trained after detection / kept",
            f"{n(w.get('steps_trained_since_detection'))} / {n(w.get('steps_kept'))}",
        ),
        ("work lost at the stop (steps trained twice)", lost_txt),
        ("work lost as the saga recorded it", n(sg.get("lost_steps"))),
        ("longest pause of training after detection", s(w.get("longest_stall_s"))),
        (
            f"UPS at {b.get('at', 'stop')}: charge / runtime (at its load) / runtime at training load",
            f"{b.get('charge_pct', '-')} % / {b.get('runtime_s', '-')} s / {b.get('runtime_at_training_load_s', '-')} s"
            if b
            else "-",
        ),
        *(
            [
                ("blackout: mains -> first training step", s(r.get("mains_to_first_step_s"))),
                ("blackout: power-cut filesystem", "yes" if r.get("powercut_fs") else "no: SIGKILL alone"),
            ]
            if r.get("blackout")
            else []
        ),
        ("final parameters bit-exact vs. reference run", "[green]yes[/green]" if r["bit_exact"] else "[red]NO[/red]"),
        ("trace", f"{r['trace_id']} ({r['span_count']} spans from {len(r['trace_services'])} services)"),
        ("wall time", f"{r['wall_s']:.0f} s"),
    ]
    for k, v in rows:
        table.add_row(k, v)
    console.print(table)
    for k, v in r.get("files", {}).items():
        console.print(f"[dim]{k}: {v}[/dim]")
