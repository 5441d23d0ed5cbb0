"""power-control as a service on a real nats-server, driving real BMCs and a real PDU:
full shutdown and restore sequences, staggering and batching, bad input."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from powerguard.bus.roles import durable_names
from powerguard.schemas import NodeState, PowerActionDone, PowerActionFailed
from tests.waiting import eventually, processed

from .helpers import Recorder, announce_saga, creds, power_on, service, shutdown, site
from .peers import free_udp_port

pytestmark = pytest.mark.integration


def bmc_node(name: str, bmc, cred: dict, **kw) -> dict:
    return {"name": name, "bmc": {"driver": "ipmi", "host": "127.0.0.1", "port": bmc.port, **cred}, **kw}


async def test_shutdown_and_restore_with_bmcs_and_pdu_outlets(make_bus, make_bmc, pdu, monkeypatch):
    cred = creds(monkeypatch)
    bmcs = {n: make_bmc(n, boot_delay=2.0, soft_off_delay=0.2, ignore_acpi=(n == "n3")) for n in ("n1", "n2", "n3")}
    nodes = [bmc_node(n, b, cred, outlets=[{"pdu": "p1", "outlet": i + 1}]) for i, (n, b) in enumerate(bmcs.items())]
    pdus = [{"name": "p1", "host": "127.0.0.1", "port": pdu.port, "options": {"community": {"env": "PG_TEST_PDU_RW"}}}]
    cfg = site(
        nodes,
        pdus=pdus,
        outlets_off_on_shutdown=True,
        outlet_stagger_s=0.5,
        max_parallel_power_on=2,
        soft_off_timeout_s=1.5,
    )
    pdu.state.write_text('{"1": "on", "2": "on", "3": "on", "4": "on"}')
    bus = await make_bus("power-control")
    rec = await Recorder().start(bus)
    pc = await service(bus, cfg)
    try:
        for n in bmcs:
            await bus.publish(shutdown(n))
        await rec.wait(lambda: all("off" in rec.states(n) for n in bmcs), what="every node off")
        assert {n: b.power for n, b in bmcs.items()} == {"n1": "off", "n2": "off", "n3": "off"}
        assert pdu.outlets() == {"1": "off", "2": "off", "3": "off", "4": "on"}
        hard = [e for e in rec.of(PowerActionDone, node="n3", action="off")]
        assert "hard off" in hard[0].data.detail  # ACPI ignored: soft-off timed out, then forced
        assert bmcs["n3"].events("command off") and not bmcs["n1"].events("command off")

        # n3's command arrives once n1 and n2 are booting: a batch of its own, and still it waits
        # for a place in the window (a window per batch let it start beside them)
        for n in ("n1", "n2"):
            await bus.publish(power_on(n))
        await rec.wait(lambda: all("booting" in rec.states(n) for n in ("n1", "n2")), what="n1 and n2 booting")
        await bus.publish(power_on("n3"))
        await rec.wait(lambda: all("ready" in rec.states(n) for n in bmcs), what="every node ready")
        assert {n: b.power for n, b in bmcs.items()} == {"n1": "on", "n2": "on", "n3": "on"}
        assert pdu.outlets() == {"1": "on", "2": "on", "3": "on", "4": "on"}
        # stagger, as the PDU itself saw it: outlet-on switches at least outlet_stagger_s apart
        ons = sorted(t for t, _, s in pdu.switch_log() if s == "on")
        assert len(ons) == 3 and all(b - a >= 0.45 for a, b in itertools.pairwise(ons))
        # the window, as the BMCs saw it: with 2 places, n3 is asked to power on only once n1 or n2 is on
        first_on = min(bmcs[n].events("power on")[-1][0] for n in ("n1", "n2"))
        failed = [(e.data.node, e.data.error) for e in rec.of(PowerActionFailed)]
        assert bmcs["n3"].events("command on")[-1][0] >= first_on, failed
        done = sorted(e.time for e in rec.of(PowerActionDone, action="outlet_on"))
        assert all((b - a).total_seconds() >= 0.45 for a, b in itertools.pairwise(done))
        assert not rec.of(PowerActionFailed)
    finally:
        await pc.stop()


async def test_redelivered_command_does_nothing_new_on_the_device(make_bus, make_bmc, monkeypatch):
    cred = creds(monkeypatch)
    bmc = make_bmc("n1", soft_off_delay=0.1)
    bus = await make_bus("power-control")
    rec = await Recorder().start(bus)
    pc = await service(bus, site([bmc_node("n1", bmc, cred)]))
    try:
        await bus.publish(shutdown("n1"))
        await rec.wait(lambda: "off" in rec.states("n1"), what="n1 off")
        bmc.state.write_text('{"power": "on", "policy": 0, "changes": 0}')  # someone switched it back on
        again = await bus.publish(shutdown("n1"))  # same idempotency key, new event id: a redelivery
        await processed(bus, durable_names("dc1")["power-control"], again.seq)  # handled: its ack
        await pc.idle()
        assert bmc.power == "on" and len(bmc.events("command soft-off")) == 1
        assert rec.states("n1").count("off") == 1
        assert pc.executed == ["saga-1/n1/shutdown"]
    finally:
        await pc.stop()


async def test_wrong_bmc_password_gives_one_failure_and_no_retry_storm(make_bus, make_bmc, monkeypatch):
    creds(monkeypatch)
    bmc = make_bmc("n1")
    bad = {"username": {"env": "PG_TEST_BMC_USER"}, "password": {"env": "PG_TEST_BMC_BAD"}}
    bus = await make_bus("power-control")
    rec = await Recorder().start(bus)
    pc = await service(bus, site([bmc_node("n1", bmc, bad)], retries=3))
    try:
        sent = await bus.publish(shutdown("n1"))
        await rec.wait(lambda: rec.of(PowerActionFailed), what="a failure")
        await processed(bus, durable_names("dc1")["power-control"], sent.seq)
        await pc.idle()  # the sequence is over: every retry it would make was made
        failed = rec.of(PowerActionFailed)
        assert len(failed) == 1
        assert failed[0].data.node == "n1" and "credentials" in failed[0].data.error
        assert "off" not in rec.states("n1") and bmc.power == "on"
        assert not bmc.events()  # not one command reached the BMC
    finally:
        await pc.stop()


async def test_a_bmc_that_garbles_one_session_under_load_is_retried_and_the_node_powers_on(
    make_bus, make_bmc, monkeypatch
):
    """The BMC answers the power-on's first session with "RAKP 2 HMAC is invalid" (a BMC under
    load), then works: power-control doubts the refusal, opens a fresh session a second later
    and the node powers on; no failure is reported and the BMC is not held off. (It was taken
    for refused credentials: no retry for 300 s, the restore timed out with the node off.)"""
    cred = creds(monkeypatch)
    bmc = make_bmc("n1", power="off", garble_sessions=1)
    bus = await make_bus("power-control")
    rec = await Recorder().start(bus)
    pc = await service(bus, site([bmc_node("n1", bmc, cred)], retries=0))
    try:
        await announce_saga(bus, state="restoring")
        await bus.publish(power_on("n1"))
        await rec.wait(lambda: "ready" in rec.states("n1") or rec.of(PowerActionFailed), what="n1 ready", timeout=60)
        assert not rec.of(PowerActionFailed), [e.data.error for e in rec.of(PowerActionFailed)]
        assert "ready" in rec.states("n1") and bmc.power == "on"
        assert [w for _, w in bmc.events() if w in ("session garbled", "command on")] == [
            "session garbled",
            "command on",
        ]
    finally:
        await pc.stop()


async def test_read_only_pdu_community_gives_a_failure_event(make_bus, pdu, monkeypatch):
    monkeypatch.setenv("PG_TEST_RO", "public")
    pdus = [{"name": "p1", "host": "127.0.0.1", "port": pdu.port, "options": {"community": {"env": "PG_TEST_RO"}}}]
    cfg = site([{"name": "n1", "outlets": [{"pdu": "p1", "outlet": 1}]}], pdus=pdus)
    bus = await make_bus("power-control")
    rec = await Recorder().start(bus)
    pc = await service(bus, cfg)
    try:
        await bus.publish(power_on("n1"))
        await rec.wait(lambda: rec.of(PowerActionFailed), what="a failure")
        f = rec.of(PowerActionFailed)[0].data
        assert f.action == "outlet_on" and f.device == "pdu:p1:1" and "noAccess" in f.error
        assert pdu.outlets()["1"] == "off"
        await pc.idle()
        assert "ready" not in rec.states("n1")
    finally:
        await pc.stop()


async def test_openipmi_and_redfish_nodes_in_one_outage(make_bus, ipmi_sim, sushy, monkeypatch):
    cred = creds(monkeypatch)
    nodes = [
        {"name": "ipmi1", "bmc": {"driver": "ipmi", "host": "127.0.0.1", "port": ipmi_sim.port, **cred}},
        {
            "name": "rf1",
            "bmc": {
                "driver": "redfish",
                "host": "127.0.0.1",
                "port": sushy.port,
                **cred,
                "options": {"ca_bundle": str(sushy.ca)},
            },
        },
    ]
    bus = await make_bus("power-control")
    rec = await Recorder().start(bus)
    pc = await service(bus, site(nodes))
    try:
        for n in ("ipmi1", "rf1"):
            await bus.publish(shutdown(n))
        await rec.wait(lambda: all("off" in rec.states(n) for n in ("ipmi1", "rf1")), what="both off")
        assert ipmi_sim.power == "off" and sushy.power() == "Off"
        for n in ("ipmi1", "rf1"):
            await bus.publish(power_on(n))
        await rec.wait(lambda: all("ready" in rec.states(n) for n in ("ipmi1", "rf1")), what="both ready")
        assert ipmi_sim.power == "on" and sushy.power() == "On"
    finally:
        await pc.stop()


async def test_dry_run_command_touches_nothing(make_bus, make_bmc, monkeypatch):
    cred = creds(monkeypatch)
    bmc = make_bmc("n1")
    bus = await make_bus("power-control")
    rec = await Recorder().start(bus)
    pc = await service(bus, site([bmc_node("n1", bmc, cred)]))
    try:
        await bus.publish(shutdown("n1", dry_run=True))
        await rec.wait(lambda: "off" in rec.states("n1"), what="n1 off (dry run)")
        assert bmc.power == "on" and not bmc.events()
        assert all(e.data.dry_run for e in rec.of(PowerActionDone))
    finally:
        await pc.stop()


async def test_a_command_left_running_is_resumed_at_start(make_bus, make_bmc, monkeypatch):
    cred = creds(monkeypatch)
    bmc = make_bmc("n1", soft_off_delay=0.1)
    cfg = site([bmc_node("n1", bmc, cred)])
    bus = await make_bus("power-control")
    await bus.setup()
    from powerguard.power_control.ledger import Ledger

    ledger = Ledger(await bus.power_actions(), "old-instance")
    await ledger.claim("saga-1/n1/shutdown", shutdown("n1").model_dump(mode="json"))  # claimed, then it died
    rec = await Recorder().start(bus)
    pc = await service(bus, cfg)
    try:
        await rec.wait(lambda: "off" in rec.states("n1"), what="resumed shutdown")
        await pc.idle()
        assert bmc.power == "off"
        assert (await ledger.get("saga-1/n1/shutdown"))["status"] == "done"
    finally:
        await pc.stop()


async def test_power_on_ramp_spaces_the_restore_as_the_bmcs_see_it(make_bus, make_bmc, monkeypatch):
    """A ramp of 60 nodes/min (one a second) over 4 nodes that could all start in one batch: the
    BMCs are asked to power on at least 1 s apart, and the waiting nodes say why. Under CPU load
    (two busy processes beside it) this failed 7 of 7 runs before the sessions were set up ahead
    of the slot and the ramp followed actual starts (commands 0.2 s apart), passes 6 of 6 now."""
    cred = creds(monkeypatch)
    bmcs = {n: make_bmc(n, boot_delay=0.2, power="off") for n in ("n1", "n2", "n3", "n4")}
    cfg = site([bmc_node(n, b, cred) for n, b in bmcs.items()], max_parallel_power_on=4, ramp={"nodes_per_min": 60})
    bus = await make_bus("power-control")
    rec = await Recorder().start(bus)
    pc = await service(bus, cfg)
    try:
        for n in bmcs:
            await bus.publish(power_on(n))
        await rec.wait(lambda: all("ready" in rec.states(n) for n in bmcs), what="every node ready")
        asked = sorted(bmcs[n].events("command on")[-1][0] for n in bmcs)
        assert all(b - a >= 0.95 for a, b in itertools.pairwise(asked)), asked  # the BMCs' own clock
        waiting = [e.data.detail for e in rec.of(NodeState) if "power-on ramp" in (e.data.detail or "")]
        assert len(waiting) >= 2  # nodes the ramp holds back say for how long
        assert not rec.of(PowerActionFailed)
    finally:
        await pc.stop()


async def test_a_later_batch_starts_while_the_earlier_batch_waits_for_readiness(make_bus, tmp_path):
    """Commands that arrive after the gather window form a second restore; with a ramp it must
    not wait for the first restore's nodes to be ready (the ramp stood idle meanwhile: 12 s of a
    125 s ramp at 12,500 nodes). The first batch's readiness is held (the site's own resume hook
    waits for a file) until the second batch's nodes are booting."""
    gate = tmp_path / "gate"
    hold = f'case "$POWERGUARD_NODE" in a1|a2) while [ ! -e {gate} ]; do sleep 0.05; done;; esac'
    nodes = [{"name": n, "bmc": {"driver": "dry-run", "host": "127.0.0.1"}} for n in ("a1", "a2", "b1", "b2")]
    bus = await make_bus("power-control")
    rec = await Recorder().start(bus)
    cfg = site(
        nodes,
        dry_run=True,
        gather_s=0.2,
        ramp={"nodes_per_min": 1200},
        scheduler={"kind": "command", "options": {"resume": ["sh", "-c", hold]}},
    )
    pc = await service(bus, cfg)
    try:
        for n in ("a1", "a2", "b1", "b2"):
            pc.seq.devices.bmc(n).state = "off"
        for n in ("a1", "a2"):
            await bus.publish(power_on(n))
        await rec.wait(lambda: all("booting" in rec.states(n) for n in ("a1", "a2")), what="a1, a2 booting")
        for n in ("b1", "b2"):
            await bus.publish(power_on(n))
        await rec.wait(
            lambda: all("ready" in rec.states(n) for n in ("b1", "b2")),
            timeout=10,
            what="b1, b2 restored while a1, a2 wait for readiness",
        )
        assert not any("ready" in rec.states(n) for n in ("a1", "a2"))
        gate.touch()
        await rec.wait(lambda: all("ready" in rec.states(n) for n in ("a1", "a2", "b1", "b2")), what="all ready")
    finally:
        gate.touch()
        await pc.stop()


async def test_a_power_on_whose_answer_was_lost_keeps_its_place_in_the_window(make_bus, monkeypatch):
    """The BMC took a1's power-on but its answer came back garbled (under load, an IPMI reply
    lost and retransmitted): the node is on, and its inrush came. It keeps its place in the
    window until its state is read (a2 waits), and it is reported on, not failed (a failure
    gave its place away at once and a2 started beside it)."""
    from powerguard.power_control.drivers.dryrun import DryRunPower
    from powerguard.power_control.errors import CommandRejected

    real_on = DryRunPower.on

    async def garbled(self):
        await real_on(self)
        if self.device == "bmc:a1":
            raise CommandRejected(f"{self.device}: BMC rejected the command (a garbled answer)")

    monkeypatch.setattr(DryRunPower, "on", garbled)
    nodes = [{"name": n, "bmc": {"driver": "dry-run", "host": "127.0.0.1"}} for n in ("a1", "a2")]
    bus = await make_bus("power-control")
    rec = await Recorder().start(bus)
    pc = await service(bus, site(nodes, dry_run=True, max_parallel_power_on=1, batch_interval_s=1.0))
    try:
        for n in ("a1", "a2"):
            pc.seq.devices.bmc(n).state = "off"
        for n in ("a1", "a2"):
            await bus.publish(power_on(n))
        await rec.wait(lambda: all("ready" in rec.states(n) for n in ("a1", "a2")), what="a1 and a2 ready")
        assert not rec.of(PowerActionFailed), [e.data for e in rec.of(PowerActionFailed)]
        done = rec.of(PowerActionDone, node="a1", action="on")
        assert "garbled" in done[0].data.detail
        on_a1 = done[0].time
        booting_a2 = next(e.time for e in rec.of(NodeState, node="a2") if e.data.state == "booting")
        assert (booting_a2 - on_a1).total_seconds() >= 0.9  # a2 waited for a1's place (+ batch_interval)
    finally:
        await pc.stop()


async def test_a_node_powered_on_by_hand_after_a_failed_power_on_is_reported_ready(make_bus, make_bmc, monkeypatch):
    """The BMC did not answer the saga's power-on; an operator fixes it and powers the node on
    by hand: power-control's read-back reports it ready for that saga, so the restore completes."""
    cred = creds(monkeypatch)
    bmc = make_bmc("n1", power="off")
    bmc.stop()  # dead BMC
    bus = await make_bus("power-control")
    rec = await Recorder().start(bus)
    pc = await service(bus, site([bmc_node("n1", bmc, cred)], device_timeout_s=1.0, readback_s=0.3))
    try:
        await bus.publish(power_on("n1"))
        await rec.wait(lambda: rec.of(PowerActionFailed, node="n1"), what="the power-on failing", timeout=60)
        assert "ready" not in rec.states("n1")
        bmc.state.write_text('{"power": "on", "policy": 0, "changes": 1}')  # the operator's power on
        bmc.start()
        await rec.wait(lambda: "ready" in rec.states("n1"), what="n1 read back ready", timeout=30)
        ready = [e for e in rec.of(NodeState, node="n1") if e.data.state == "ready"]
        assert ready[0].data.saga_id == "saga-1" and ready[0].data.detail == "read back by power-control"
    finally:
        await pc.stop()


async def test_a_retried_off_falls_back_to_the_outlets_when_the_bmc_is_dead(make_bus, make_bmc, pdu, monkeypatch):
    cred = creds(monkeypatch)
    bmc = make_bmc("n1")
    bmc.stop()  # dead BMC
    pdus = [{"name": "p1", "host": "127.0.0.1", "port": pdu.port, "options": {"community": {"env": "PG_TEST_PDU_RW"}}}]
    pdu.state.write_text('{"1": "on", "2": "on", "3": "on", "4": "on"}')
    node = bmc_node("n1", bmc, cred, outlets=[{"pdu": "p1", "outlet": 1}])
    bus = await make_bus("power-control")
    rec = await Recorder().start(bus)
    pc = await service(bus, site([node], pdus=pdus, device_timeout_s=1.0))
    try:
        await bus.publish(shutdown("n1"))  # the first off: the BMC does not answer, nothing else is touched
        await rec.wait(lambda: rec.of(PowerActionFailed, node="n1", action="off"), what="the off failing", timeout=60)
        assert pdu.outlets()["1"] == "on" and "off" not in rec.states("n1")
        retry = shutdown("n1")
        data = retry.data.model_copy(update={"idempotency_key": "saga-1/n1/shutdown.r1", "retry": 1})
        await bus.publish(retry.model_copy(update={"data": data}))
        await rec.wait(lambda: "off" in rec.states("n1"), what="n1 off by its outlet", timeout=60)
        assert pdu.outlets()["1"] == "off"
        off = next(e for e in rec.of(NodeState, node="n1") if e.data.state == "off")
        assert off.data.detail.startswith("outlets off after the BMC failed")
    finally:
        await pc.stop()


async def test_dead_bmcs_never_hold_up_the_healthy_nodes_power_on(make_bus, make_bmc, ipmi_sim, monkeypatch):
    """Four nodes, two of them with a dead BMC, two places in the power-on window: every healthy
    node (OpenIPMI's ipmi_sim and the simulated BMC) is ready before either dead BMC has even
    been given up on. Fixed batches of two held the third node until the dead one's retries ended."""
    cred = creds(monkeypatch)
    bmcs = {"n0": make_bmc("n0", power="off"), "n2": make_bmc("n2", power="off"), "n3": make_bmc("n3", power="off")}
    ipmi_sim.state.write_text("0\n")
    bmcs["n0"].stop()
    bmcs["n2"].stop()  # dead: n0 and n2; healthy: n1 (ipmi_sim) and n3
    nodes = [bmc_node(n, b, cred) for n, b in bmcs.items()] + [bmc_node("n1", ipmi_sim, cred)]
    bus = await make_bus("power-control")
    rec = await Recorder().start(bus)
    pc = await service(bus, site(nodes, max_parallel_power_on=2, device_timeout_s=1.5, retries=3, retry_backoff_s=0.5))
    try:
        for n in ("n0", "n1", "n2", "n3"):
            await bus.publish(power_on(n))
        await rec.wait(
            lambda: (
                all("ready" in rec.states(n) for n in ("n1", "n3")) and len(rec.of(PowerActionFailed, action="on")) == 2
            ),
            timeout=90,
            what="the healthy nodes ready and both dead ones given up on",
        )
        ready = [e.time for e in rec.of(NodeState) if e.data.state == "ready"]
        gave_up = [e.time for e in rec.of(PowerActionFailed, action="on")]
        assert {e.data.node for e in rec.of(PowerActionFailed, action="on")} == {"n0", "n2"}
        timeline = sorted((e.time, e.data.node, getattr(e.data, "state", None) or e.data.action) for e in rec.events)
        assert max(ready) < min(gave_up), f"a healthy node waited for a dead BMC: {timeline}"
        assert ipmi_sim.power == "on" and bmcs["n3"].power == "on"
    finally:
        await pc.stop()


async def test_a_saga_state_read_answered_before_the_state_arrived_is_read_again_not_refused(
    make_bus, make_bmc, monkeypatch
):
    """In a cluster the direct get of a saga's newest state may be answered by a replica a
    moment behind the leader: no state yet, for a command the coordinator sent after
    announcing it. Here the state is stored only once power-control's first read has been
    answered "none" (the test watches the read and its reply on the server): the command is
    not refused as "never announced"; a read again finds the state and the node goes off."""
    cred = creds(monkeypatch)
    bmc = make_bmc("n1", soft_off_delay=0.1)
    bus = await make_bus("power-control")
    watcher = await make_bus("test")
    rec = await Recorder().start(bus)
    pc = await service(bus, site([bmc_node("n1", bmc, cred)]), sagas=())
    reads: set[str] = set()  # reply subjects of power-control's reads of the saga's state
    none_yet = asyncio.Event()

    async def on_read(msg) -> None:
        reads.add(msg.reply)

    async def on_reply(msg) -> None:
        if msg.subject in reads and (msg.headers or {}).get("Status") == "404":
            none_yet.set()

    saga_subject = bus.subjects.saga("saga-late")
    await watcher.nc.subscribe(f"$JS.API.DIRECT.GET.{bus.names.stream}.{saga_subject}", cb=on_read)
    await watcher.nc.subscribe("_INBOX.>", cb=on_reply)
    await watcher.nc.flush()
    try:
        await bus.publish(shutdown("n1", saga="saga-late"))
        await asyncio.wait_for(none_yet.wait(), 10)
        await announce_saga(watcher, "saga-late")  # the state reaches "the replica" after the first read
        await rec.wait(lambda: "off" in rec.states("n1"), what="n1 off")
        assert not rec.of(PowerActionFailed) and len(bmc.events("command soft-off")) == 1
    finally:
        await pc.stop()


async def test_a_shutdown_of_a_saga_that_moved_on_is_refused_after_one_read(make_bus, make_bmc, monkeypatch):
    """A replica behind the leader only ever shows an older state, so a shutdown refused
    because its saga is already restoring stands at once: one read of the saga's state (the
    test counts power-control's direct gets on the server), no re-reads holding the consumer."""
    cred = creds(monkeypatch)
    bmc = make_bmc("n1", soft_off_delay=0.1)
    bus = await make_bus("power-control")
    watcher = await make_bus("test")
    rec = await Recorder().start(bus)
    await announce_saga(watcher, "saga-on", state="restoring")
    pc = await service(bus, site([bmc_node("n1", bmc, cred)]), sagas=())
    reads: list[str] = []

    async def on_read(msg) -> None:
        reads.append(msg.reply)

    await watcher.nc.subscribe(f"$JS.API.DIRECT.GET.{bus.names.stream}.{bus.subjects.saga('saga-on')}", cb=on_read)
    await watcher.nc.flush()
    try:
        await bus.publish(shutdown("n1", saga="saga-on"))
        await rec.wait(lambda: rec.of(PowerActionFailed), what="the refusal")
        # every read was sent before the refusal: a round trip to the server delivers them all
        await watcher.nc.flush()
        assert "restoring" in rec.of(PowerActionFailed)[0].data.error
        assert len(reads) == 1, f"{len(reads)} reads of a state that only a newer announcement could change"
        assert not bmc.events("command soft-off")
    finally:
        await pc.stop()


async def test_a_device_check_waiting_on_a_dead_bmc_never_holds_up_a_power_action(make_bus, make_bmc, monkeypatch):
    """The device checks run every ``device_check_s``, outages or not. With one IPMI request at
    a time allowed, a check waiting on a dead BMC's timeout must not hold the slot a healthy
    node's shutdown needs: the node is off while that check still waits."""
    cred = creds(monkeypatch)
    bmc = make_bmc("n1", soft_off_delay=0.1)
    dead = {"name": "n2", "bmc": {"driver": "ipmi", "host": "127.0.0.1", "port": free_udp_port(), **cred}}
    cfg = site([bmc_node("n1", bmc, cred), dead], device_timeout_s=5.0, max_parallel_per_driver={"ipmi": 1})
    bus = await make_bus("power-control")
    rec = await Recorder().start(bus)
    pc = await service(bus, cfg)
    try:
        check = asyncio.create_task(pc.check_devices())
        # the check holds its one IPMI slot (n1's quick read, then n2's wait, or n2 first)
        await eventually(lambda: pc.checked_devices.saturated("ipmi"), 10, "the check to hold its one IPMI slot")
        await bus.publish(shutdown("n1"))
        await rec.wait(lambda: "off" in rec.states("n1"), what="n1 off")
        assert not check.done(), "the shutdown waited for the device check"
        health = await check
        assert sorted(health.problems) == ["n2"]
    finally:
        await pc.stop()
