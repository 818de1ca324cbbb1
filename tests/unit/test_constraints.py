"""Node constraints at the extender's edge: a pod's nodeSelector / affinity / tolerations and a node's
labels / taints / cordon are read from the API objects, reach the ledger, and steer the queue gate."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from extender.cache import ClaimCache
from extender.decide import PolicyUse
from extender.inventory import inventory_of_node
from extender.samples import pod
from packing.asks import AskReader, MalformedPod
from packing.constraints import node_facts, pod_constraints
from packing.ledger import Ledger
from packing.node_fit import NodeConstraints, NodeFacts, Requirement, Taint, Term, Toleration
from packing.policies import BEST_FIT
from packing.products import load_catalog
from packing.queue import WAITING_FOR_RESERVATION
from tests.unit.test_cluster_sync import V100, gated_pod, setup

CATALOG = load_catalog()


def pinned_pod(name: str, product: str, created: str, pool: str | None) -> dict[str, Any]:
    doc = gated_pod(name, product, created)
    if pool is not None:
        doc["spec"]["nodeSelector"] = {"pool": pool}
    return doc


def pool_node(name: str, pool: str, gpus: int = 1, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "uid": f"node-{name}", "labels": {
        "pool": pool, "nvidia.com/gpu.product": V100, "nvidia.com/gpu.count": str(gpus)}}, "spec": spec}


def test_pod_constraints_read_selector_affinity_and_tolerations_in_canonical_order() -> None:
    doc = pod("p", "v100-25")
    doc["spec"]["nodeSelector"] = {"zone": "z1", "pool": "a"}
    doc["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "gpus", "operator": "Gt", "values": ["4"]},
                                                    {"key": "rack", "operator": "In", "values": ["r2", "r1"]}]},
                              {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n9"]}]}]},
        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": {}}]}}
    doc["spec"]["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                                  {"key": "a", "value": "1", "tolerationSeconds": 30}]
    c = pod_constraints(doc)
    assert c == NodeConstraints(
        (("pool", "a"), ("zone", "z1")),
        (Term((Requirement("gpus", "Gt", ("4",)), Requirement("rack", "In", ("r1", "r2")))),
         Term((), (Requirement("metadata.name", "In", ("n9",)),))),
        (Toleration("a", "Equal", "1", ""), Toleration("nvidia.com/gpu", "Exists", "", "NoSchedule")))
    shuffled = copy.deepcopy(doc)
    shuffled["spec"]["tolerations"].reverse()
    assert pod_constraints(shuffled) == c  # one request shape for pods that say the same thing
    ask = AskReader(CATALOG).read(doc)
    assert ask.request is not None and ask.request.constraints == c


def bare(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` without the tolerations the API server's DefaultTolerationSeconds plugin adds."""
    doc["spec"].pop("tolerations", None)
    return doc


def test_a_pod_without_constraints_has_none() -> None:
    assert pod_constraints(bare(pod("p", "v100-25"))) is None
    ask = AskReader(CATALOG).read(bare(pod("p", "v100-25")))
    assert ask.request == CATALOG.request("v100-25")


def test_the_default_tolerations_are_constraints_every_pod_shares() -> None:
    a, b = pod_constraints(pod("a", "v100-25")), pod_constraints(pod("b", "v100-50"))
    assert a is not None and a == b
    assert {t.key for t in a.tolerations} == {"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"}


def test_required_affinity_without_terms_is_kept_it_matches_no_node() -> None:
    doc = bare(pod("p", "v100-25"))
    doc["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": []}}}
    assert pod_constraints(doc) == NodeConstraints(affinity=())


@pytest.mark.parametrize(("path", "value"), [
    (("nodeSelector",), ["pool"]),
    (("nodeSelector",), {"pool": 1}),
    (("tolerations",), {"key": "a"}),
    (("tolerations",), [{"key": 3}]),
    (("affinity",), {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "a", "operator": "In", "values": "x"}]}]}}}),
    (("affinity",), {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": {}}}}),
])
def test_malformed_constraints_are_a_malformed_pod(path: tuple[str, ...], value: Any) -> None:
    doc = pod("p", "v100-25")
    doc["spec"][path[0]] = value
    with pytest.raises(MalformedPod):
        AskReader(CATALOG).read(doc)


def test_node_facts_read_labels_taints_and_cordon_skipping_malformed_entries() -> None:
    node = pool_node("n1", "a", unschedulable=True, taints=[
        {"key": "gpu", "value": "yes", "effect": "NoSchedule"}, {"key": "x"}, "junk",
        {"key": "spot", "effect": "PreferNoSchedule", "timeAdded": "2026-01-01T00:00:00Z"}])
    facts = node_facts(node)
    assert facts.unschedulable and dict(facts.labels)["pool"] == "a"
    assert facts.taints == (Taint("gpu", "yes", "NoSchedule"), Taint("spot", "", "PreferNoSchedule"))
    assert node_facts({"metadata": {"name": "n"}, "spec": {"taints": {"bad": 1}}}) == NodeFacts()
    assert inventory_of_node("n1", node, CATALOG).facts == facts


def test_cache_set_facts_is_undone_with_a_failing_transaction() -> None:
    cache = ClaimCache(Ledger(), PolicyUse.named(BEST_FIT.name))
    cache.add_node("n1", [("g1", V100, 32768)])
    with pytest.raises(RuntimeError), cache.undo_on_error():
        assert cache.set_facts("n1", NodeFacts((("pool", "a"),), (), True))
        raise RuntimeError("boom")
    assert cache.ledger.nodes["n1"].facts == NodeFacts()
    assert not cache.set_facts("n1", NodeFacts())  # unchanged: nothing to do
    cache.ledger.verify()


def test_the_gate_keeps_a_pinned_pod_waiting_for_its_full_pool_and_admits_the_one_behind_it() -> None:
    api, state, sync, _ = setup()
    api.nodes["a1"] = pool_node("a1", "a")
    api.nodes["b1"] = pool_node("b1", "b")
    # under the default worst-first the pinned half, the longest-waiting claim that fits nowhere, is the
    # front of the line: a GPU of its pool is held for it
    first = [api.pod(pinned_pod(f"first{i}", "v100-50", f"2026-01-01T00:00:0{i}Z", "a")) for i in range(2)]
    pinned = api.pod(pinned_pod("pinned", "v100-50", "2026-01-01T00:00:03Z", "a"))
    free = api.pod(pinned_pod("free", "v100-50", "2026-01-01T00:00:04Z", None))
    sync.rebuild()
    now = 1767225600.0 + 10  # 10 s after they were created
    admitted = {a.claim: a.allocation.node for a in state.admit(now)}
    assert [admitted[f["metadata"]["uid"]] for f in first] == ["a1", "a1"]
    assert admitted[free["metadata"]["uid"]] == "b1"
    waiting = {e.claim: e for e in state.explain(now)}
    e = waiting[pinned["metadata"]["uid"]]
    assert e.reason == WAITING_FOR_RESERVATION and e.position == 1
    assert "it may use 1 of 2 nodes (node selector pool=a)" in e.message and "of node a1 for it" in e.message
    state.ledger.verify()


def test_a_cordon_seen_by_the_watch_reaches_the_ledger_and_kicks_the_gate() -> None:
    api, state, sync, kicks = setup()
    api.nodes["a1"] = pool_node("a1", "a")
    sync.rebuild()
    before = len(kicks)
    sync._on_node("MODIFIED", pool_node("a1", "a"))
    assert len(kicks) == before  # nothing changed: no kick
    sync._on_node("MODIFIED", pool_node("a1", "a", unschedulable=True))
    assert state.ledger.nodes["a1"].unschedulable and len(kicks) == before + 1
    api.pod(pinned_pod("p", "v100-25", "2026-01-01T00:00:00Z", None))
    sync.pods.relist()
    assert state.admit(1.8e9) == []  # cordoned: no new reservation
    sync._on_node("MODIFIED", pool_node("a1", "a"))
    assert [a.allocation.node for a in state.admit(1.8e9 + 1)] == ["a1"]
    state.ledger.verify()


def test_nodes_seeded_by_name_take_pinned_pods_and_the_watch_describes_nodes() -> None:
    from extender.inventory import UNKNOWN_FACTS
    from packing.inventory import Card

    api, state, sync, _ = setup()
    state.sync_node("seeded", [Card("s/gpu-0", 0, V100, 32768)])  # no Node object: its labels unknown
    assert state.ledger.nodes["seeded"].facts == UNKNOWN_FACTS
    api.nodes["a1"] = pool_node("a1", "a")
    sync.rebuild()
    assert state.ledger.nodes["a1"].facts.known and dict(state.ledger.nodes["a1"].facts.labels)["pool"] == "a"
