"""Ops alerting end to end: Debian's prometheus and prometheus-alertmanager scrape the real
services of a simulated-site outage drill (and the JetStream health exporter) with the shipped
rules and Alertmanager config; the test's webhook receiver stands in for the pager. Asserted on
what the webhook received: UpsOnBattery fires with the site and UPS labels and resolves after the
restore; a dead-lettered message fires DeadLettersAppearing; a killed service fires
PowerGuardServiceDown. (Rules' ``for:`` are shortened to a few seconds: powerguard.sim.alerts.)"""

from __future__ import annotations

import asyncio

import pytest

from powerguard.sim.alert_drill import alert_drill
from tests.bench_modules import load
from tests.conftest import require_binary

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


def test_the_on_call_is_paged_for_the_outage_a_dead_letter_and_a_dead_service_and_told_when_power_is_back(tmp_path):
    require_binary("prometheus", "prometheus")
    require_binary("prometheus-alertmanager", "prometheus-alertmanager")
    r = asyncio.run(alert_drill(tmp_path, steps=200))
    assert r["report"]["saga_states"][-1] == "done"
    assert r["on_battery_labels"]["site"] == "demo" and r["on_battery_labels"]["ups"] == "ups-a"
    assert r["on_battery_labels"]["severity"] == "warning"
    assert r["on_battery_event_at"] < r["on_battery_paged_at"] < r["on_battery_resolved_at"]
    # within scrape + evaluation + group_wait of the outage (1 s + 1 s + 1 s here, with slack)
    assert r["on_battery_paged_at"] - r["on_battery_event_at"] < 10
    alerts = {(p["alert"], p["status"]) for p in r["pages"]}
    assert ("DeadLettersAppearing", "firing") in alerts and ("PowerGuardServiceDown", "firing") in alerts
    # the info alert that inhibits node-down alerts during the deliberate shutdown is never paged
    assert not any(p["alert"] == "SagaShuttingDownNodes" for p in r["pages"])
    # bench/alerting.py's figures of this drill (the benchmark's analysis, run on CI's drill)
    f = load("alerting").figures(r)
    assert f["utility_failure_to_page_s"] >= f["on_battery_event_to_page_s"] > 0
    assert f["dead_letter_to_page_s"] > 0 and f["service_killed_to_page_s"] > 0
