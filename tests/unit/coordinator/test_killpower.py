"""The last step of an outage longer than the battery (pure): when a UPS may be told to cut its
output and return, and the reason whenever it may not."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from powerguard.coordinator import commands, inputs, killpower
from powerguard.coordinator.topology import Topology

from .harness import POLICY, TOPO, Drive
from .test_saga_properties import apply, steps

# the way to feed A being cut (on battery, j1's ranks acked, a short runtime, n1 and n2 off), in
# order, with up to three random steps before each of its steps (random steps alone almost
# never get there; a random step may still turn the way aside: power back, feed B on battery)
TOWARDS = (
    [("power", "A", True, 300.0, False)]
    + [("ack", "j1", r, True, "ckpt") for r in range(4)]
    + [("power", "A", True, 50.0, False), ("node", "n1", "off"), ("node", "n2", "off"), ("advance", 1.0)]
    + [("node", "s1", "off"), ("node", "w1", "off")]  # the last stage: storage, network
    + [("power", "A", False, None, False), ("advance", 40.0), ("advance", 60.0)]  # mains back: the restore
)
NOISE = steps.map(lambda s: s[0])
MIXED = st.tuples(*[st.lists(NOISE, max_size=3) for _ in TOWARDS]).map(
    lambda gaps: [s for gap, step in zip(gaps, TOWARDS, strict=True) for s in (*gap, step)]
)

# the harness's site with a storage, a network and a management node on feed A (and a storage
# node on A+B, which A alone does not take down while B is on line)
SITE = Topology(
    site="dc1",
    feeds=TOPO.feeds,
    infra={
        "s1": ("storage", ("A",)),
        "s2": ("storage", ("A", "B")),
        "w1": ("network", ("A",)),
        "m1": ("management", ("A",)),
    },
)
ON = POLICY.model_copy(update={"ups_off": True, "ups_off_delay_s": 30, "ups_off_runtime_s": 60, "ups_off_after_s": 600})


def down_on_a(policy=POLICY, *, runtime_s: float = 50) -> Drive:
    """Feed A on battery: j1 (n1, n2) acks, the runtime falls below the reserve, n1 and n2 go
    off (by default with ups_off not allowed, so the saga itself tells no UPS: ``decide`` below
    is asked with ``ON``)."""
    d = Drive(policy=policy)
    d.power("A", True)
    d.ack_all("j1")
    d.power("A", True, runtime_s=runtime_s)
    d.node("n1", "off")
    d.node("n2", "off")
    assert d.state == "down"
    return d


def decide(d: Drive, policy=ON) -> killpower.Decision:
    return killpower.decide(d.rec, now=d.now, topo=d.topo, policy=policy)


def test_a_ups_whose_nodes_are_off_and_whose_jobs_are_durable_is_told_when_its_runtime_is_short():
    d = down_on_a()
    out = decide(d)
    assert [(u.ups, u.key, u.delay_s) for u in out.due] == [("A", "s1/ups:A/output_off", 30)]
    assert out.due[0].reason.startswith("runtime 50s at or below 90s")
    # n3 is fed by A and B, and B is on line: cutting A leaves it powered, so it never blocks A
    assert killpower.fed_alone("A", TOPO, {"A"}) == ["n1", "n2"]


def test_never_unless_the_site_allows_it():
    out = decide(down_on_a(), POLICY)
    assert not out.due and out.blocked == {"A": "the site does not allow it (coordinator.ups_off: false)"}


def test_never_once_mains_is_back_nor_twice():
    d = down_on_a()
    d.rec.issued.add("s1/ups:A/output_off")
    assert decide(d).blocked == {"A": "already told in this saga"}
    d = down_on_a()
    d.power("A", False, charge_pct=40)
    assert decide(d).blocked == {"A": "mains is back"}


def test_never_while_a_node_it_alone_feeds_is_not_off_or_its_off_failed():
    d = Drive()
    d.power("A", True)
    d.ack_all("j1")
    d.power("A", True, runtime_s=50)
    d.node("n1", "off")
    assert decide(d).blocked == {"A": "n2, which it alone feeds, is not off yet"}
    d.node("n2", "failed_off", "no IPMI answer")  # commanded off again (off_retries): not off yet
    assert decide(d).blocked == {"A": "n2, which it alone feeds, is not off yet"}
    d = Drive(policy=POLICY.model_copy(update={"off_retries": 0}))
    d.power("A", True)
    d.ack_all("j1")
    d.power("A", True, runtime_s=50)
    d.node("n1", "off")
    d.node("n2", "failed_off", "no IPMI answer")
    assert d.state == "partly_down"
    assert decide(d).blocked == {"A": "n2, which it alone feeds, may still be on (its off failed: no IPMI answer)"}


def test_never_while_a_node_was_powered_on_by_hand_after_its_off():
    """Found by the property below: a node reported on while the saga was down (an operator's
    power on during the outage), or whose later off failed, was still counted off, and its UPS
    would have been cut under it."""
    d = down_on_a()
    d.node("n1", "ready", "read back by power-control")
    assert d.state == "down" and d.rec.nodes["n1"].power_on_at is None
    why = "n1, which it alone feeds, may be on again: reported on (read back by power-control): powered on by hand?"
    assert decide(d).blocked == {"A": why}
    d.node("n1", "failed_off", "no IPMI answer")  # a later off failed: its state unknown
    assert "a later off failed (no IPMI answer): its power state is unknown" in decide(d).blocked["A"]
    d.node("n1", "off")  # off again
    assert [u.ups for u in decide(d).due] == ["A"]


def test_never_while_a_rank_on_its_nodes_has_no_durable_checkpoint():
    d = Drive()
    d.power("A", True)
    d.ack("j1", 0)
    d.ack("j1", 1)
    d.advance(200)  # the power round's deadline passes with ranks 2 and 3 silent
    d.power("A", True, runtime_s=50)
    d.node("n1", "off")
    d.node("n2", "off")
    assert d.state == "down"
    assert decide(d).blocked == {"A": "job j1 has ranks without a durable checkpoint of this outage"}


def test_a_long_battery_is_cut_at_the_site_limit_not_before():
    d = down_on_a(runtime_s=50)
    d.power("A", True, runtime_s=900)  # the estimate recovers (the load is gone): not due by runtime
    assert decide(d).blocked == {"A": "not yet: the battery lasts"}
    d.advance(599)
    assert not decide(d).due
    d.advance(2)
    out = decide(d)
    assert [u.ups for u in out.due] == ["A"] and out.due[0].reason.startswith("down on battery for 601s")


def test_a_drill_never_cuts_a_ups():
    d = down_on_a()
    d.rec.drill = True
    assert decide(d).blocked == {"A": "a drill: a UPS's output is never cut"}


def test_the_saga_tells_the_ups_once_down_and_restores_only_after_it_could_cycle():
    d = down_on_a(ON)  # ups_off allowed: the saga tells A itself as it goes down
    cmds = [c for c in d.commands if c.kind == "ups_off"]
    assert [(c.target, c.key, c.args["delay_s"]) for c in cmds] == [("A", "s1/ups:A/output_off", 30)]
    told = d.rec.ups_off["A"]
    assert told.told_at == d.now and told.reason.startswith("runtime 50s")
    assert commands.pending(d.rec, d.policy) == cmds  # unanswered: a restarted coordinator sends it again
    d.send(inputs.UpsReport(ups="A", ok=True, detail="shutdown.return done by the UPS (ups1)"))
    assert d.rec.ups_off["A"].done_at == d.now and commands.pending(d.rec, d.policy) == []
    d.power("A", False, charge_pct=90)  # mains is back at once: the UPS still cycles its output
    d.advance(d.policy.restore_stable_s + 1)
    assert d.state == "down"  # 31 s: before the command's 30 s delay + ups_off_return_s (60 s)
    d.advance(30 + 60 - d.policy.restore_stable_s - 1)
    assert d.state == "restoring" and ("power_on", "n1") in d.kinds(d.commands)


def test_a_failed_ups_command_is_recorded_and_not_sent_again():
    d = down_on_a(ON)
    d.send(inputs.UpsReport(ups="A", ok=False, detail="upsd user pg may not run shutdown.return"))
    assert d.rec.ups_off["A"].error == "upsd user pg may not run shutdown.return"
    assert commands.pending(d.rec, d.policy) == [] and len([c for c in d.commands if c.kind == "ups_off"]) == 1


def test_the_last_stage_shuts_storage_then_network_down_tells_the_ups_then_shuts_powerguards_hosts():
    d = Drive(policy=ON, topo=SITE)
    d.power("A", True)
    d.ack_all("j1")
    d.power("A", True, runtime_s=50)
    assert [c.target for c in d.commands if c.kind == "shutdown"] == ["n1", "n2"]  # compute only, as ever
    d.node("n1", "off")
    d.node("n2", "off")
    assert d.state == "down"
    last = [(c.kind, c.target) for c in d.commands[-1:]]
    assert last == [("shutdown", "s1")] and "ups_off" not in [c.kind for c in d.commands]  # storage first
    assert decide(d).blocked == {"A": "the last stage: s1, which it alone feeds, is not off yet"}
    assert [c.target for c in commands.pending(d.rec, d.policy)] == ["s1"]  # re-sent after a restart
    d.node("s1", "off")
    assert [(c.kind, c.target) for c in d.commands[-1:]] == [("shutdown", "w1")]  # then the network
    d.node("w1", "off")
    told = [c for c in d.commands if c.kind == "ups_off"]
    assert [(c.target, c.args["nodes"]) for c in told] == [("A", ["n1", "n2", "s1", "w1"])]
    assert [(c.kind, c.target) for c in d.commands[-2:]] == [("ups_off", "A"), ("shutdown", "m1")]  # ours last
    assert "s2" not in d.rec.nodes  # fed by B too, and B is on line: it keeps its power
    d.node("m1", "off")
    d.power("A", False, charge_pct=90)
    d.advance(100)
    assert d.state == "restoring"
    assert sorted(c.target for c in d.commands if c.kind == "power_on") == ["m1", "n1", "n2", "s1", "w1"]


def test_a_storage_node_whose_off_failed_keeps_the_ups_from_being_told():
    d = Drive(policy=ON.model_copy(update={"off_retries": 0}), topo=SITE)
    d.power("A", True)
    d.ack_all("j1")
    d.power("A", True, runtime_s=50)
    d.node("n1", "off")
    d.node("n2", "off")
    d.node("s1", "failed_off", "no IPMI answer")
    assert decide(d).blocked == {
        "A": "the last stage: s1, which it alone feeds, may still be on (its off failed: no IPMI answer)"
    }
    assert not [c for c in d.commands if c.kind == "ups_off"] and "w1" not in d.rec.nodes


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(MIXED)
def test_a_ups_is_due_only_when_everything_it_alone_powers_is_off_and_durable(steps_):
    """For any sequence of readings, acks, reports and time: a UPS is due only while it is on
    battery, every node that loses power with it (by the site's feeds and the readings the test
    sent) last reported off, and every job with a rank there has a complete round; once, and
    no node is powered on before the UPS could cycle its output."""
    d = Drive(policy=ON, topo=SITE)
    last_report: dict[str, str] = {}
    told: dict[str, float] = {}
    for step in steps_:
        if step[0] == "node" and d.rec is not None:
            last_report[step[1]] = step[2]
        for c in apply(d, step):  # in the order the saga issued them
            if c.kind == "shutdown" and c.target in SITE.infra:
                role, feeds = SITE.infra[c.target]
                if role == "management":
                    assert set(feeds) & set(told), f"{c.target} shut down before its UPS was told"
                else:
                    assert not set(feeds) & set(told), f"{c.target} ({role}) shut down after its UPS was told"
                dark = [n for n, f in TOPO.feeds.items() if set(f) & set(feeds) and set(f) <= set(feeds)]
                assert all(last_report.get(n) == "off" for n in dark), f"{c.target} shut down before compute was off"
            if c.kind == "power_on":
                late = {u: t for u, t in told.items() if d.now < t + ON.ups_off_delay_s + ON.ups_off_return_s}
                assert not late, f"{c.target} powered on before {late} could cycle its output"
            if c.kind != "ups_off":
                continue
            ups = c.target
            assert ups not in told, f"{ups} told twice"
            told[ups] = d.now
            assert d.ups[ups].on_battery, f"{ups} told while on line"
            on_battery = {u for u, v in d.ups.items() if v.on_battery}
            dark = [n for n, feeds in TOPO.feeds.items() if ups in feeds and set(feeds) <= on_battery]
            loads = [n for n, (r, f) in SITE.infra.items() if r != "management" and ups in f and set(f) <= on_battery]
            assert all(last_report.get(n) == "off" for n in loads), f"{ups} told before its loads {loads} were off"
            assert dark, "a UPS that feeds nothing of the saga is never told"
            for n in dark:
                last = last_report.get(n)
                assert last == "off", f"{ups} told while {n} last reported {last}"
                assert d.rec.nodes[n].shutdown_at is not None
            for job, plan in d.rec.jobs.items():
                if set(plan.ranks.values()) & set(dark):
                    rnd = plan.final if plan.final is not None and plan.final.complete else plan
                    assert rnd.complete and not rnd.missing, f"{ups} told while {job} is not durable"
