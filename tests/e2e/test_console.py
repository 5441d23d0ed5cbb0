"""The operator console in a real browser (Debian's headless Chromium, driven by Playwright)
during a simulated-site outage drill (`powerguard demo --console`): the page shows the UPS on
battery, the acks going from 0 to all, the deadline countdown, the nodes going off and on, and
the saga done; screenshots go to the test's directory; the browser logs no JavaScript error.

What the page showed is recorded in the page itself: a MutationObserver (installed before the
console's own script runs) notes every value the elements took. Sampling from the test instead
missed states that lasted less than a screenshot (CI: the acks were 0/4 for 0.7 s, and the test
saw only 4/4)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import require_binary
from tests.waiting import eventually_sync

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]
SHOTS = Path(os.environ.get("POWERGUARD_CONSOLE_SHOTS", "")) if os.environ.get("POWERGUARD_CONSOLE_SHOTS") else None


def _start_demo(tmp_path: Path) -> tuple[subprocess.Popen, str]:
    log = open(tmp_path / "demo.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "powerguard.cli", "demo", "--console", "--json", str(tmp_path / "report.json")],
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={**os.environ, "COLUMNS": "200"},
    )

    def url() -> str | None:
        m = re.search(r"operator console: (http://127\.0\.0\.1:\d+/)", (tmp_path / "demo.log").read_text())
        assert m or proc.poll() is None, (tmp_path / "demo.log").read_text()[-3000:]  # the demo exited
        return m.group(1) if m else None

    tail = lambda: (tmp_path / "demo.log").read_text()[-3000:]  # noqa: E731
    return proc, eventually_sync(url, 300, "the demo to print the console URL", every=0.5, details=tail)


# Every value the watched elements took, in the order the page showed them.
_RECORDER = """(() => {
  const seen = { acks: [], countdowns: [], saga_states: [], node_states: [] };
  const note = (list, value) => { if (value && !list.includes(value)) list.push(value); };
  const look = () => {
    note(seen.acks, document.getElementById('acks')?.textContent);
    note(seen.countdowns, document.getElementById('countdown')?.textContent);
    note(seen.saga_states, document.getElementById('saga-state')?.textContent);
    document.querySelectorAll('#nodes .node-state').forEach((e) => note(seen.node_states, e.dataset.state));
  };
  window.__powerguardSeen = seen;
  const all = { subtree: true, childList: true, characterData: true, attributes: true };
  new MutationObserver(look).observe(document, all);
})();"""


def test_console_shows_an_outage_from_on_battery_to_done_in_a_real_browser(tmp_path):
    from playwright.sync_api import sync_playwright

    chromium = require_binary("chromium", "chromium")

    shots = SHOTS or tmp_path
    shots.mkdir(parents=True, exist_ok=True)
    proc, url = _start_demo(tmp_path)
    errors: list[str] = []
    seen: dict[str, object] = {}
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1280, "height": 1400})
            page.add_init_script(_RECORDER)
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(url)
            page.wait_for_selector("#conn.ok", timeout=30_000)
            page.screenshot(path=str(shots / "console-1-idle.png"), full_page=True)
            page.wait_for_selector('#ups [data-state="on_battery"]', timeout=240_000)  # the outage began
            page.screenshot(path=str(shots / "console-2-on-battery.png"), full_page=True)
            deadline = time.monotonic() + 240
            shot_acks = shot_off = False
            while True:
                assert time.monotonic() < deadline, "the outage did not end on the page within 240 s"
                state = page.evaluate(
                    """() => ({
                        acks: document.getElementById('acks')?.textContent || null,
                        saga: document.getElementById('saga-state')?.textContent || null,
                        nodes: [...document.querySelectorAll('#nodes .node-state')].map(e => e.dataset.state),
                        past: [...document.querySelectorAll('#past .past-state')].map(e => e.textContent),
                    })"""
                )
                if not shot_acks and state["acks"] and state["acks"].split("/")[0] == state["acks"].split("/")[1]:
                    page.screenshot(path=str(shots / "console-3-acked.png"), full_page=True)
                    shot_acks = True
                if not shot_off and "off" in state["nodes"]:
                    page.screenshot(path=str(shots / "console-4-nodes-off.png"), full_page=True)
                    shot_off = True
                if "done" in state["past"] and not state["saga"]:
                    break
                time.sleep(0.2)
            page.screenshot(path=str(shots / "console-5-done.png"), full_page=True)
            seen.update((k, set(v)) for k, v in page.evaluate("() => window.__powerguardSeen").items())
            seen["countdowns"] = {c for c in seen["countdowns"] if c.endswith(" s")}  # a figure, not the dash
            link = page.get_attribute("#past tbody tr:first-child a[href$='timeline.svg']", "href")
            svg = page.request.get(url + link)  # the past outage's phase timeline picture
            seen["svg"] = svg.status == 200 and "<svg" in svg.text() and "shutting_down" in svg.text()
            browser.close()
    finally:
        proc.send_signal(signal.SIGINT)  # ends --console; the demo writes its report and exits
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    acks = seen["acks"]
    assert any(a.startswith("0/") for a in acks), acks  # the acks went from 0 ...
    assert any(a.split("/")[0] == a.split("/")[1] != "0" for a in acks), acks  # ... to all
    assert len(seen["countdowns"]) >= 2, seen["countdowns"]  # the deadline counted down
    assert {"off", "on"} <= seen["node_states"] or {"off", "ready"} <= seen["node_states"], seen["node_states"]
    assert {"checkpointing", "down"} <= seen["saga_states"], seen["saga_states"]
    assert seen.get("svg") is True
    assert not errors, errors
    for name in ("console-2-on-battery.png", "console-3-acked.png", "console-4-nodes-off.png", "console-5-done.png"):
        assert (shots / name).stat().st_size > 10_000


def test_a_drill_is_shown_as_a_drill_in_a_real_browser(tmp_path):
    """Before: during `powerguard drill --dry-run` the page showed every node "off" and nothing said
    it was a drill (the snapshot carried `saga.drill`, the page ignored it). Now a banner, the
    nodes "off (drill)", the timeline's "[drill]" entries. The console's own server, fed the
    events a drill's saga and power-control publish."""
    import asyncio
    import threading
    from datetime import UTC, datetime, timedelta

    from playwright.sync_api import sync_playwright

    from powerguard.console import ConsoleState
    from powerguard.console.server import make_app, serve
    from powerguard.schemas import NodeState, NodeStateData, SagaData, SagaState, SagaStateChanged

    chromium = require_binary("chromium", "chromium")
    state = ConsoleState()
    t0 = datetime.now(UTC)
    for i, (st, reason) in enumerate([("detected", "drill: ups-a on battery"), ("shutting_down", "runtime low")]):
        data = SagaData(
            saga_id="drill-1", site="dc1", ups=["ups-a"], state=SagaState(st), reason=reason, nodes=["n1"], drill=True
        )
        state.apply(SagaStateChanged(source="/powerguard/coordinator", time=t0 + timedelta(seconds=i), data=data))
    state.apply(
        NodeState(source="/powerguard/power-control", data=NodeStateData(node="n1", state="off", saga_id="drill-1"))
    )
    loop = asyncio.new_event_loop()
    started = threading.Event()
    box: dict = {}

    def run() -> None:
        asyncio.set_event_loop(loop)
        box["runner"], box["url"] = loop.run_until_complete(serve(make_app(state), port=0))
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert started.wait(30)
    errors: list[str] = []
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(box["url"])
            page.wait_for_selector("#drill-banner", timeout=30_000)
            banner = page.text_content("#drill-banner")
            node = page.text_content('#nodes tr[data-name="n1"] .node-state')
            timeline = page.eval_on_selector_all("#timeline li", "els => els.map(e => e.textContent)")
            marked = page.evaluate("() => document.body.classList.contains('drill')")
            page.screenshot(path=str(tmp_path / "console-drill.png"), full_page=True)
            browser.close()
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
    assert "DRILL" in banner and "dry-run" in banner
    assert node == "off (drill)"
    assert timeline and all("[drill]" in t for t in timeline), timeline
    assert marked and not errors, errors
