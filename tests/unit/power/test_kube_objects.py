"""The Kubernetes adapter's pure rules: taint lists that never lose anyone else's taint, a hold
lifted only by whoever placed it, an eviction's refusal in the budget's own words, and the
outage edges read from the coordinator's announcements."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from powerguard.power_control.saga_edges import SagaEdges
from powerguard.power_control.schedulers import kube_objects as ko
from powerguard.power_control.schedulers.base import NoScheduler
from powerguard.schemas import SagaData, SagaState, SagaStateChanged

OURS = {"key": ko.ON_BATTERY, "value": "s1", "effect": "NoSchedule"}
THEIRS = {"key": "maintenance", "value": "ops", "effect": "NoSchedule"}


def test_a_taint_is_added_once_and_others_are_kept():
    assert ko.with_taint([THEIRS], ko.ON_BATTERY, "s1", "NoSchedule") == [THEIRS, OURS]
    assert ko.with_taint([THEIRS, OURS], ko.ON_BATTERY, "s2", "NoSchedule") is None  # already fenced


def test_only_the_named_taints_are_removed_and_none_means_nothing_to_write():
    assert ko.without_taints([THEIRS, OURS], [(ko.ON_BATTERY, "s1")]) == [THEIRS]
    assert ko.without_taints([THEIRS, OURS], [(ko.ON_BATTERY, "s2")]) is None  # another outage's taint stays
    oos = {"key": ko.OUT_OF_SERVICE, "value": "nodeshutdown", "effect": "NoExecute"}
    assert ko.without_taints([oos], [(ko.OUT_OF_SERVICE, ko.OUT_OF_SERVICE_VALUE)]) is None  # an operator's


def _apply(cq: dict, patch: dict | None) -> dict:
    """A JSON merge patch applied as the API server does (None deletes a key)."""
    if patch is None:
        return cq
    out = {"metadata": dict(cq["metadata"]), "spec": dict(cq.get("spec") or {})}
    notes = dict(out["metadata"].get("annotations") or {})
    for k, v in (patch.get("metadata", {}).get("annotations") or {}).items():
        if v is None:
            notes.pop(k, None)
        else:
            notes[k] = v
    out["metadata"]["annotations"] = notes
    out["spec"].update(patch.get("spec") or {})
    return out


def test_a_hold_is_placed_on_an_open_queue_and_lifted_only_by_the_last_saga_that_holds_it():
    """Before: saga s2 found the queue held by s1 and recorded nothing; s1's restart lifted the
    hold while s2's outage went on (admission reopened in the middle of it)."""
    cq = {"metadata": {"name": "gpus"}, "spec": {}}
    patch = ko.hold_patch(cq, "s1")
    assert patch["spec"] == {"stopPolicy": "Hold"} and patch["metadata"]["annotations"][ko.HELD_BY] == "s1"
    held = _apply(cq, patch)
    both = _apply(held, ko.hold_patch(held, "s2"))  # a second outage's saga joins the hold
    assert ko.holders(both) == ["s1", "s2"] and both["spec"]["stopPolicy"] == "Hold"
    assert ko.hold_patch(both, "s2") is None and ko.release_patch(both, "s3") is None
    s2_left = _apply(both, ko.release_patch(both, "s1"))
    assert s2_left["spec"]["stopPolicy"] == "Hold" and ko.holders(s2_left) == ["s2"]
    assert ko.release_patch(s2_left, "s2")["spec"] == {"stopPolicy": "None"}
    drained_by_ops = {"metadata": {"name": "gpus"}, "spec": {"stopPolicy": "HoldAndDrain"}}
    assert ko.hold_patch(drained_by_ops, "s1") is None and ko.release_patch(drained_by_ops) is None


@given(st.lists(st.tuples(st.sampled_from(["hold", "release"]), st.sampled_from(["s1", "s2", "s3"])), max_size=20))
def test_a_queue_is_held_exactly_while_a_saga_that_held_it_has_not_released_it(ops):
    cq = {"metadata": {"name": "gpus"}, "spec": {}}
    holding: set[str] = set()
    for op, saga in ops:
        if op == "hold":
            cq = _apply(cq, ko.hold_patch(cq, saga))
            holding.add(saga)
        else:
            cq = _apply(cq, ko.release_patch(cq, saga))
            holding.discard(saga)
        assert (cq["spec"].get("stopPolicy", "None") == "Hold") == bool(holding)
        assert set(ko.holders(cq)) == holding


def test_an_eviction_refusal_names_the_budget():
    details = {"causes": [{"reason": "DisruptionBudget", "message": "The disruption budget web needs 2 healthy pods"}]}
    assert ko.refused_by(details, "Cannot evict pod") == "The disruption budget web needs 2 healthy pods"
    assert ko.refused_by(None, "Cannot evict pod") == "Cannot evict pod"


def test_the_controller_reference_is_the_owner_that_recreates():
    pod = {
        "metadata": {
            "ownerReferences": [{"kind": "Node", "name": "x"}, {"kind": "Job", "name": "j", "controller": True}]
        }
    }
    assert ko.controller(pod)["name"] == "j"
    assert ko.controller({"metadata": {}}) is None


def saga(state: SagaState, *, saga_id: str = "s1", drill: bool = False) -> SagaStateChanged:
    return SagaStateChanged(
        source="test",
        time=datetime.now(UTC),
        data=SagaData(saga_id=saga_id, site="demo", state=state, nodes=["n1"], drill=drill),
    )


def test_an_outage_starts_once_and_ends_once_and_a_drill_changes_nothing():
    edges = SagaEdges(NoScheduler(), {"n1"})
    assert edges.edge(saga(SagaState.DETECTED)) == "start"
    edges.started.add("s1")
    assert edges.edge(saga(SagaState.CHECKPOINTING)) is None
    assert edges.edge(saga(SagaState.CANCELLED)) == "end"
    edges.ended.add("s1")
    assert edges.edge(saga(SagaState.DONE)) is None
    assert edges.edge(saga(SagaState.DETECTED, saga_id="d1", drill=True)) is None
    assert edges.edge(saga(SagaState.RESTORING, saga_id="s9")) is None  # seen first after its shutdown: no fence


async def test_the_adapter_is_told_the_edges_with_the_sites_nodes_only():
    calls = []

    class Recording(NoScheduler):
        async def on_battery(self, nodes, *, saga_id):
            calls.append(("start", list(nodes), saga_id))
            return "ok"

        async def outage_over(self, nodes, *, saga_id):
            calls.append(("end", list(nodes), saga_id))
            return "ok"

    edges = SagaEdges(Recording(), {"n1"})
    event = saga(SagaState.CHECKPOINTING)
    event.data.nodes.append("elsewhere")
    await edges.on(event)
    await edges.on(saga(SagaState.HOLDING))
    await edges.on(saga(SagaState.DONE))
    assert calls == [("start", ["n1"], "s1"), ("end", ["n1"], "s1")]
