"""An upgrade from the previous releases' layout: one events stream over `pg.>` (the jobs' traffic
in it too) without direct gets, and the coordinator's one durable reading power events, acks and
results. `powerguard bootstrap` of this release without --update changes nothing and says what
is missing; with --update (the CLI, the admin credential) the events stream gives the jobs'
subjects up, the jobs' stream is created, and the durables take this release's configuration,
keeping every message, every KV value of lasting state and the durables' positions; the agent
registry, soft state, moves from disk to memory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from nats.js import api

from powerguard.bus.consumer import durable_config
from powerguard.bus.roles import durable_batches, durable_filters, durable_names
from powerguard.schemas import OnBattery, PowerData

from .conftest import SITE

POWERGUARD = str(Path(sys.executable).parent / "powerguard")


def previous_release_filters(names) -> dict[str, list[str]]:
    s = names.subjects
    site = SITE
    return {
        f"coordinator-{site}": [
            s.power_events(site),
            s.drill_power_events(site),
            s.ckpt_ack("*", "*"),
            s.power_result("*"),
            s.job_result("*"),
            s.job_resumed("*"),
        ],
        f"power-control-{site}": [s.power_cmd("*"), s.job_cmd("*")],
    }


def bootstrap(dep, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [POWERGUARD, "bootstrap", "--site-name", SITE, "--url", dep.url, "--creds", str(dep.creds_of("admin")), *extra],
        capture_output=True,
        text=True,
        timeout=120,
    )


async def test_bootstrap_update_takes_the_previous_layout_to_this_release(tmp_path):
    from .conftest import start

    dep = start(tmp_path)
    try:
        admin = await dep.connect("admin")
        # the previous release's bootstrap
        names = dep.names
        await admin.js.add_stream(
            api.StreamConfig(name=names.stream, subjects=[names.subjects.all], storage=api.StorageType.FILE)
        )
        for name, filters in previous_release_filters(names).items():
            await admin.js.add_consumer(names.stream, durable_config(name, filters=filters, deliver="new"))
        # its agent registry on disk (this release keeps it in memory)
        await admin.js.create_key_value(
            api.KeyValueConfig(bucket=names.agents, history=1, ttl=30, storage=api.StorageType.FILE)
        )
        await admin.setup()  # its buckets
        ups = await dep.connect("ups-monitor")
        for _ in range(2):
            await ups.publish(OnBattery(data=PowerData(site=SITE, ups="ups1", on_battery=True)))
        coord = await dep.connect("coordinator")
        await (await coord.kv(names.sagas)).put("s-open", {"state": "holding"})
        durable = durable_names(SITE)["power-control"]
        before = await admin.js.consumer_info(names.stream, durable)

        plain = bootstrap(dep)
        assert plain.returncode == 0, plain.stderr
        assert "this release needs" in plain.stderr and "bootstrap --update" in plain.stderr
        assert (await admin.js.stream_info(names.stream)).config.allow_direct is not True
        assert "stored on disk" in plain.stderr
        assert (await admin.js.stream_info(f"KV_{names.agents}")).config.storage == api.StorageType.FILE

        upgraded = bootstrap(dep, "--update")
        assert upgraded.returncode == 0, upgraded.stderr
        info = await admin.js.stream_info(names.stream)
        assert info.config.allow_direct is True and info.state.messages == 2
        assert sorted(info.config.subjects) == sorted(names.subjects.event_trees)
        jobs = await admin.js.stream_info(names.jobs_stream)
        assert jobs.config.subjects == names.subjects.job_trees and jobs.config.discard_new_per_subject
        for name, filters in durable_filters(names, SITE).items():
            c = await admin.js.consumer_info(names.stream_of(filters[0]), name)
            assert sorted(c.config.filter_subjects or [c.config.filter_subject]) == sorted(filters), name
            # the coordinator's batches (the previous release's durables held 2,048 unacknowledged)
            assert c.config.max_ack_pending >= 4 * durable_batches(SITE).get(name, 0), name
        after = await admin.js.consumer_info(names.stream, durable)
        assert (after.delivered.stream_seq, after.num_pending) == (before.delivered.stream_seq, before.num_pending)
        assert (await (await coord.kv(names.sagas)).get("s-open")).json() == {"state": "holding"}
        # the registry moved to memory (soft state: every live rank writes it again at its next beat)
        assert (await admin.js.stream_info(f"KV_{names.agents}")).config.storage == api.StorageType.MEMORY
    finally:
        await dep.close()
