"""The battery budget that does not trust one reading, the measured shutdown, and the final
checkpoint taken whenever it fits (pure saga and site core)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from powerguard.coordinator import battery, budget, facts
from powerguard.coordinator.inputs import Power
from powerguard.coordinator.record import UpsView
from powerguard.schemas import SagaState

from .harness import POLICY, TOPO, Drive
from .site import Site

AT_STOP = POLICY.model_copy(update={"hold_policy": "checkpoint-at-stop", "shutdown_reserve_s": 120})


# ----------------------------------------------------------------------------- the estimate
def test_discharge_estimate_from_charge_over_time_scaled_to_the_current_load():
    samples: list[list[float]] = []
    for t, charge in ((0, 100), (30, 99), (60, 98), (90, 97)):
        battery.add_sample(samples, t, charge, 40)
    # 3 % in 90 s at 40 % load: 97 % lasts 2910 s at that load, half of it at 80 %
    assert battery.discharge_runtime(samples, 40) == 2910
    assert battery.discharge_runtime(samples, 80) == 1455
    assert battery.discharge_runtime(samples[:1], 40) is None  # one reading says nothing


def test_a_repeated_reading_keeps_the_time_it_was_first_seen():
    samples: list[list[float]] = []
    battery.add_sample(samples, 0, 100, None)
    battery.add_sample(samples, 50, 100, None)
    assert samples == [[0, 100, -1]]


def test_capacity_estimate_where_the_ups_reports_no_runtime():
    # 1000 Wh at 50 % charge, 2000 W rated at 45 % load: 500 Wh / 900 W = 2000 s
    assert battery.capacity_runtime(50, 45, (1000, 2000)) == 2000
    est = battery.estimate(reported_s=None, samples=[], charge_pct=50, load_pct=45, capacity=(1000, 2000))
    assert (est.runtime_s, est.source) == (2000, "capacity")


def test_the_most_conservative_estimate_wins_and_says_which_it_is():
    samples = [[0, 100, 50], [60, 90, 50]]  # 10 % a minute: 9 minutes left, whatever the UPS says
    est = battery.estimate(reported_s=1800, samples=samples, charge_pct=90, load_pct=50)
    assert (est.runtime_s, est.source, est.reported_s) == (540, "discharge", 1800)


def test_an_optimistic_ups_estimate_shortens_the_budget_in_the_saga():
    d = Drive(policy=AT_STOP)
    d.power("A", True, runtime_s=1000, charge_pct=100)
    d.send(Power(ups="A", on_battery=True, runtime_s=1000, charge_pct=100, load_pct=50))
    d.now += 60
    d.send(Power(ups="A", on_battery=True, runtime_s=1000, charge_pct=80, load_pct=50))
    # the UPS still says 1000 s; 20 % a minute says 80 % lasts 240 s
    est = budget.ups_estimate(d.rec.ups["A"])
    assert est.source == "discharge" and round(est.runtime_s) == 240
    assert budget.budget_s(d.rec.supply, TOPO, AT_STOP) == 240 - 120 - 10


def test_the_ups_view_keeps_its_first_estimate_of_the_outage():
    views: dict[str, UpsView] = {}
    facts.observe(views, Power(ups="A", on_battery=True, runtime_s=900, charge_pct=100), 0)
    facts.observe(views, Power(ups="A", on_battery=True, runtime_s=300, charge_pct=60), 120)
    v = views["A"]
    assert (v.start_runtime_s, v.start_charge_pct) == (900, 100)
    assert battery.observed_runtime(v.samples, v.start_charge_pct) == 300  # 40 % in 120 s: 100 % lasts 300 s


# ----------------------------------------------------------------------------- the shutdown need
def test_below_the_reserve_the_final_checkpoint_is_taken_when_the_measured_shutdown_leaves_time():
    """600 -> 100 s of runtime in one step, reserve 120 s: the hold ends, and a 0.7 s final
    checkpoint fits many times in 100 s less the 20 s the shutdown was measured to need."""
    d = Drive(policy=AT_STOP)
    d.power("A", True, runtime_s=600)
    d.rec.shutdown_need = {"A": 20.0 / AT_STOP.shutdown_factor}
    d.advance(0.7)
    d.ack_all("j1")
    assert d.state == "holding"
    cmds = d.power("A", True, runtime_s=100)
    assert d.state == "final_checkpoint" and d.kinds(cmds) == [("ckpt_request", "j1")]
    assert cmds[0].args["deadline"] == d.now + 100 - 20 - 10


def test_a_fresh_site_whose_runtime_jumps_below_the_reserve_still_takes_the_final_from_the_margin():
    """The first outage of a site (nothing measured): 600 -> 100 s with a 120 s reserve. The
    budget is gone (the reserve stands for the shutdown), but 2 x the 0.7 s power checkpoint fits
    in 10 % of the 90 s left: the final is taken, its deadline 9 s, and the stop reason says so."""
    d = Drive(policy=AT_STOP)
    d.power("A", True, runtime_s=600)
    d.advance(0.7)
    d.ack_all("j1")
    cmds = d.power("A", True, runtime_s=100)
    assert d.state == "final_checkpoint" and d.kinds(cmds) == [("ckpt_request", "j1")]
    assert cmds[0].args["deadline"] == d.now + 0.1 * (100 - 10)
    assert "final checkpoint within 9.0s of the runtime's margin" in d.rec.stop_reason
    d.advance(0.5)  # the deadline holds while the runtime does (it is the margin's, not the budget's)
    assert d.state == "final_checkpoint"
    for rank in range(4):
        d.ack("j1", rank, request_id="s1/j1/final", step=190)
    assert d.state == "shutting_down" and d.rec.jobs["j1"].final_note == "committed at step 190"


def test_a_final_too_costly_for_the_margin_and_any_final_under_fsd_are_skipped_by_name():
    costly = Drive(policy=AT_STOP)
    costly.power("A", True, runtime_s=600)
    costly.advance(8.0)  # a power checkpoint of 8 s: 16 s is more than 10 % of the 90 s left
    costly.ack_all("j1")
    costly.power("A", True, runtime_s=100)
    assert costly.state == "shutting_down"
    note = costly.rec.jobs["j1"].final_note
    assert note.startswith("skipped: the power checkpoint took 8.0s") and "more than 10% of the runtime left" in note
    fsd = Drive(policy=AT_STOP)
    fsd.power("A", True, runtime_s=600)
    fsd.advance(0.7)
    fsd.ack_all("j1")
    fsd.power("A", True, runtime_s=500, fsd=True)
    assert fsd.state == "shutting_down" and fsd.rec.jobs["j1"].final_note.startswith("skipped: forced shutdown")


def test_the_sites_own_shutdown_timings_bound_what_a_never_measured_shutdown_needs():
    """A site whose power-control soft-offs in at most 5 s (and stops jobs within 62 s, 4 device
    calls of 5 s) needs at most 87 s for a shutdown, not the 120 s reserve: with 100 s left the
    final fits the budget itself."""
    from powerguard.coordinator.topology import Topology
    from powerguard.schemas import SiteConfig

    site = SiteConfig.model_validate(
        {
            "site": "dc1",
            "ups": [{"name": "A", "driver": "nut"}],
            "nodes": [{"name": n, "feeds": ["A"], "bmc": {"driver": "ipmi"}} for n in ("n1", "n2")],
            "power_control": {"soft_off_timeout_s": 5, "device_timeout_s": 5},
        }
    )
    topo = Topology.from_site(site)
    assert topo.group_bound_s("A") == 2 + 60 + 5 + 4 * 5
    supply = budget.Supply(ups={"A": UpsView(on_battery=True, runtime_s=100)})
    assert budget.shutdown_need_s(supply, topo, AT_STOP) == 87  # not the reserve
    assert budget.budget_s(supply, topo, AT_STOP) == 100 - 87 - 10
    window = budget.final_window(supply, topo, AT_STOP, cost_s=0.7)
    assert (window.seconds, window.from_margin) == (3, False)
    measured = budget.Supply(ups=supply.ups, shutdown_need={"A": 10.0})
    assert budget.shutdown_need_s(measured, topo, AT_STOP) == 15  # a measurement refines it
    slow = budget.Supply(ups=supply.ups, shutdown_need={"A": 100.0})
    assert budget.shutdown_need_s(slow, topo, AT_STOP) == 87  # never past the site's own bound


def test_the_site_core_learns_a_real_outages_shutdown_and_a_drill_teaches_nothing():
    s = Site()
    s.send(s.power("A", True))
    s.send(*s.acks("s1", "j1"))
    s.send(s.power("A", True, runtime_s=50))
    s.advance(12)
    s.send(s.node("n1", "off", "s1"))
    s.advance(3)
    s.send(s.node("n2", "off", "s1"))
    assert s.core.shutdown_need() == {"A": 15.0}
    s.send(s.power("A", False))
    s.advance(POLICY.restore_stable_s + 1)
    s.send(s.node("n1", "ready", "s1"), s.node("n2", "ready", "s1"), s.resumed("j1", "s1"))
    assert not s.core.open
    s.send(s.power("A", True))
    assert s.core.open["s2"].shutdown_need == {"A": 15.0}  # the next outage starts knowing it
    fresh = Site()
    fresh.core.resume([s.steps[-1].changed[0]])
    assert fresh.core.shutdown_need() == {}  # an open saga has not shut down yet: nothing to learn
    done = {"drill": True, "saga_id": "d1", "state": SagaState.DONE}
    drill = s.steps[-1].changed[0].model_copy(deep=True, update=done)
    fresh.core.resume([drill])
    assert fresh.core.shutdown_need() == {}


# ----------------------------------------------------------------------------- property
readings = st.lists(st.floats(min_value=0, max_value=900), min_size=1, max_size=12)


@settings(max_examples=300, deadline=None)
@given(
    readings,
    st.floats(min_value=0.1, max_value=30),
    st.one_of(st.none(), st.floats(min_value=1, max_value=200)),
)
def test_the_final_checkpoint_is_taken_whenever_it_fits(runtimes, took_s, measured):
    """For any runtime trace: at the stop, a checkpoint-at-stop job whose power checkpoint took
    ``took_s`` gets its final checkpoint exactly when ``took_s`` fits the budget then (runtime
    less what the shutdown needs less the margin), or twice it fits in 10 % of the runtime left,
    and its deadline never passes the window it was taken in."""
    d = Drive(policy=AT_STOP.model_copy(update={"max_on_battery_s": 10_000}))
    d.power("A", True, runtime_s=900)
    if measured is not None:
        d.rec.shutdown_need = {"A": measured}
    d.advance(took_s)
    d.ack_all("j1")
    for runtime in runtimes:
        before = d.state
        d.power("A", True, runtime_s=runtime)
        if before != "holding" or d.rec.stop_decided_at is None:
            continue
        plan = d.rec.jobs["j1"]
        rec_budget = budget.budget_s(d.rec.supply, TOPO, AT_STOP)
        cost = plan.duration_s
        left = budget.runtime(d.rec.supply, TOPO)
        margin = AT_STOP.final_margin_share * max(0.0, left - AT_STOP.margin_s)
        if rec_budget > 0 and cost <= rec_budget:
            assert plan.final is not None, f"skipped a final that fitted: {plan.final_note}"
            assert plan.final.deadline <= d.now + rec_budget + 1e-9
        elif AT_STOP.final_ckpt_factor * cost <= margin:
            assert plan.final is not None, f"skipped a final the margin had room for: {plan.final_note}"
            assert plan.final.deadline <= d.now + margin + 1e-9
        else:
            assert plan.final is None and plan.final_note.startswith("skipped")
        break


def test_an_outage_records_the_ups_estimate_against_its_observed_discharge_for_status_console_and_trace():
    """A UPS that said 600 s and drained 15 % in 60 s at 40 % load (360 s from its 90 %): the
    figures status, the console and the trace show say so, per UPS."""
    from powerguard.coordinator.figures import saga_figures

    s = Site()
    s.send(s.power("A", True, runtime_s=600, charge_pct=90, load_pct=40))
    for k in range(1, 7):
        s.advance(10)
        s.send(s.power("A", True, runtime_s=600, charge_pct=90 - 2.5 * k, load_pct=40))
    s.send(s.power("A", False, runtime_s=600, charge_pct=75))
    rec = s.core.open.get("s1") or next(r for r in s.steps[-1].changed if r.saga_id == "s1")
    b = saga_figures(rec)["battery"]["A"]
    assert b["predicted_s"] == 600 and b["load_pct"] == 40
    assert 300 < b["observed_s"] < 420 and b["ratio"] == round(b["observed_s"] / 600, 3)
