"""Alert-to-page latency: an outage drill of the simulated site with Debian's prometheus and
prometheus-alertmanager scraping its real services (scrape and evaluation every 1 s, Alertmanager
group_wait 1 s, rules' ``for:`` shortened to a few seconds: powerguard.sim.alerts) and a webhook
receiver standing in for the pager. Reports utility failure -> UpsOnBattery page, the resolve
after power returns, a dead-lettered message -> page and a killed service -> page.
Writes bench/results/alerting.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from pathlib import Path

from powerguard.sim.alert_drill import alert_drill

RESULTS = Path(__file__).parent / "results" / "alerting.json"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="pg-bench-alerting-") as tmp:
        r = asyncio.run(alert_drill(Path(tmp)))
    result = figures(r)
    print(json.dumps(result, indent=2))
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


def figures(r: dict) -> dict:
    """The alert drill's record -> alerting.json (CI: tests/e2e/test_alerting.py's drill goes
    through it: the benchmark's smallest size is that one drill)."""
    return {
        "utility_failure_to_page_s": r["utility_failure_to_page_s"],
        "on_battery_event_to_page_s": round(r["on_battery_paged_at"] - r["on_battery_event_at"], 3),
        # the outage's own length is in it: power came back in between
        "on_battery_page_to_resolved_page_s": round(r["on_battery_resolved_at"] - r["on_battery_paged_at"], 3),
        "dead_letter_to_page_s": r["dead_letter_to_page_s"],
        "service_killed_to_page_s": r["service_killed_to_page_s"],
        "rules_for_s": r["for_s"],
        "scrape_and_evaluation_s": 1,
        "group_wait_s": 1,
    }


if __name__ == "__main__":
    main()
