"""GPU inventory: the agent's annotation, GPU Feature Discovery labels, and how a new inventory reaches the ledger.

The sync's rules (``extender.inventory_sync``): new cards at once, unhealthy or vanished cards
withdrawn (their slices stay accounted), a vanished or changed card removed or replaced once its
slices leave; an inventory the ledger refuses changes nothing.
"""

from __future__ import annotations

import json

import pytest

from extender.inventory import Enforcement, inventory_of_node, parse_inventory
from extender.samples import gpu_node, pod
from extender.standalone import MemoryBinder
from extender.state import ExtenderState, StateConfig
from extender.wire import BindingArgs, ExtenderArgs
from packing.inventory import ANNOTATION as INVENTORY_ANNOTATION
from packing.inventory import Card, InventoryError, encode
from packing.products import load_catalog

CATALOG = load_catalog()
V100 = "Tesla-V100-SXM2-32GB"


def cards_of_node(name: str, node: dict[str, object], catalog: object = CATALOG) -> tuple[Card, ...]:
    return inventory_of_node(name, node, CATALOG).cards


def test_gfd_labels_give_cards_with_stable_synthetic_ids() -> None:
    cards = cards_of_node("n1", gpu_node("n1", 4), CATALOG)
    assert [c.uuid for c in cards] == [f"n1/gpu-{i}" for i in range(4)]
    assert {c.model for c in cards} == {V100} and {c.memory_mib for c in cards} == {32768}
    assert cards == cards_of_node("n1", gpu_node("n1", 4), CATALOG)


def test_capacity_is_counted_in_catalog_units_for_known_models() -> None:
    nvml = cards_of_node("n1", gpu_node("n1", 1, memory_mib=32510), CATALOG)  # NVML's total for a 32 GB V100
    assert nvml[0].memory_mib == 32768
    t4 = cards_of_node("n2", gpu_node("n2", 1, "Tesla-T4", memory_mib=15360), CATALOG)
    assert t4[0].memory_mib == 15360  # unknown model: the reported memory


def test_the_agents_inventory_annotation_wins_over_labels_and_means_enforcement() -> None:
    inventory = [Card("GPU-aaa", 0, V100, 32768), Card("GPU-bbb", 1, "Tesla-V100-PCIE-32GB", 32768, healthy=False)]
    node = gpu_node("n1", 8, inventory=inventory)
    assert inventory_of_node("n1", node, CATALOG).cards == tuple(inventory)
    assert inventory_of_node("n1", node, CATALOG).enforcement is Enforcement.AGENT
    assert inventory_of_node("n1", gpu_node("n1", 8), CATALOG).enforcement is Enforcement.NONE
    assert parse_inventory(encode(inventory), CATALOG) == tuple(inventory)


def test_the_annotation_orders_cards_by_index_and_defaults_to_healthy() -> None:
    value = json.dumps([{"uuid": "GPU-b", "index": 1, "model": V100, "memory_mib": 32510},
                        {"uuid": "GPU-a", "index": 0, "model": V100, "memory_mib": 32510, "healthy": True},
                        {"uuid": "GPU-c", "index": 2, "model": V100, "memory_mib": 32510, "healthy": False,
                         "serial": "a newer agent's field"}])
    cards = parse_inventory(value, CATALOG)
    assert [(c.uuid, c.healthy, c.memory_mib) for c in cards] == [
        ("GPU-a", True, 32768), ("GPU-b", True, 32768), ("GPU-c", False, 32768)]


def test_a_node_without_gpu_labels_has_no_cards() -> None:
    assert cards_of_node("cpu", gpu_node("cpu", 0), CATALOG) == ()
    assert cards_of_node("bare", {"metadata": {"name": "bare"}}, CATALOG) == ()
    only_product = gpu_node("n", 1)
    del only_product["metadata"]["labels"]["nvidia.com/gpu.count"]
    assert len(cards_of_node("n", only_product, CATALOG)) == 1


@pytest.mark.parametrize("count", ["two", "²", "١", "-1", "99999999999"])
def test_malformed_labels_are_inventory_errors(count: str) -> None:
    node = gpu_node("n", 2)
    node["metadata"]["labels"]["nvidia.com/gpu.count"] = count
    with pytest.raises(InventoryError, match=r"gpu\.count"):
        cards_of_node("n", node, CATALOG)


# ---- learning in full-Nodes mode (standalone --learn-nodes) --------------------------------------


def state() -> ExtenderState:
    config = StateConfig(standalone=True, learn_nodes=True, policy="best-fit")  # the tests name best fit's choices
    return ExtenderState(CATALOG, MemoryBinder(), config, clock=lambda: 100.0)  # a still clock: deadlines repeat


def bind(s: ExtenderState, name: str, product: str, node: dict[str, object]) -> str:
    """filter on ``node`` then bind there; the pod's uid."""
    p = pod(name, product)
    out = s.filter(ExtenderArgs(p, [str(node["metadata"]["name"])], [node]))  # type: ignore[index]
    assert out.result.node_names, out.result
    assert s.bind(BindingArgs(name, "default", p["metadata"]["uid"], out.result.node_names[0])).ok
    return str(p["metadata"]["uid"])


def test_full_nodes_teach_the_ledger_and_unchanged_nodes_cost_nothing() -> None:
    s = state()
    nodes = [gpu_node("a", 2), gpu_node("b", 1), gpu_node("cpu", 0)]
    out = s.filter(ExtenderArgs(pod("p", "v100-100"), ["a", "b", "cpu"], nodes))
    assert sorted(s.ledger.nodes) == ["a", "b"]
    assert out.result.node_names == ["b"]  # best fit: the node with fewest empty cards
    assert out.result.nodes == [{"metadata": {"name": "b"}}]  # the scheduler reads only the names
    assert "cpu" in out.result.unresolvable
    before = s.ledger.fingerprint()
    s.filter(ExtenderArgs(pod("p", "v100-100"), ["a", "b", "cpu"], nodes))
    assert s.ledger.fingerprint() == before


def test_learning_is_off_unless_asked_for() -> None:
    s = ExtenderState(CATALOG, MemoryBinder(), StateConfig(standalone=True), clock=lambda: 100.0)
    s.filter(ExtenderArgs(pod("p", "v100-100"), ["a"], [gpu_node("a", 2)]))
    assert s.ledger.nodes == {}
    with pytest.raises(ValueError, match="standalone"):
        StateConfig(learn_nodes=True)


def test_new_cards_join_a_busy_node_at_once_and_its_slices_stay() -> None:
    s = state()
    uid = bind(s, "p", "v100-50", gpu_node("a", 2))
    held = s.ledger.allocations[uid]
    s.filter(ExtenderArgs(pod("q"), ["a"], [gpu_node("a", 4)]))
    assert [g.uuid for g in s.ledger.nodes["a"].gpus] == [f"a/gpu-{i}" for i in range(4)]
    assert s.ledger.allocations[uid] == held
    s.ledger.verify()


def test_a_vanished_card_is_withdrawn_while_it_holds_a_slice_and_removed_once_it_leaves() -> None:
    s = state()
    cards = [Card(f"GPU-{i}", i, V100, 32768) for i in range(3)]
    uid = bind(s, "p", "v100-100", gpu_node("a", 0, inventory=cards))
    on = s.ledger.allocations[uid].gpus[0]
    kept = [c for c in cards if c.uuid != on][:1]
    s.filter(ExtenderArgs(pod("q"), ["a"], [gpu_node("a", 0, inventory=kept)]))
    gpus = {g.uuid: g.withdrawn for g in s.ledger.nodes["a"].gpus}
    assert gpus == {kept[0].uuid: False, on: True}  # the idle vanished card went at once
    assert s.snapshot()["nodes"][0]["inventory_pending"] is True
    for i in range(2):  # nothing new lands on the withdrawn card: one more whole card fits, not two
        out = s.filter(ExtenderArgs(pod(f"w{i}", "v100-100"), ["a"], [gpu_node("a", 0, inventory=kept)]))
        if out.result.node_names:
            assert s.ledger.allocations[pod(f"w{i}")["metadata"]["uid"]].gpus == (kept[0].uuid,)
    assert s.release(uid)
    assert [g.uuid for g in s.ledger.nodes["a"].gpus] == [kept[0].uuid]
    assert s.snapshot()["nodes"][0]["inventory_pending"] is False
    s.ledger.verify()


def test_an_unhealthy_card_takes_nothing_new_until_it_is_healthy_again() -> None:
    s = state()
    cards = [Card("GPU-0", 0, V100, 32768), Card("GPU-1", 1, V100, 32768)]
    uid = bind(s, "p", "v100-25", gpu_node("a", 0, inventory=cards))
    on = s.ledger.allocations[uid].gpus[0]
    sick = [Card(c.uuid, c.index, c.model, c.memory_mib, healthy=c.uuid != on) for c in cards]
    out = s.filter(ExtenderArgs(pod("q", "v100-25"), ["a"], [gpu_node("a", 0, inventory=sick)]))
    assert s.ledger.gpus[on].withdrawn and uid in s.ledger.allocations
    q = s.ledger.allocations[pod("q")["metadata"]["uid"]]
    assert q.gpus != (on,), "a slice placed on an unhealthy card"
    assert out.result.node_names == ["a"]
    s.filter(ExtenderArgs(pod("r"), ["a"], [gpu_node("a", 0, inventory=cards)]))
    assert not s.ledger.gpus[on].withdrawn
    s.ledger.verify()


def test_a_card_whose_model_changed_under_a_slice_changes_once_it_is_idle() -> None:
    s = state()
    pcie = "Tesla-V100-PCIE-32GB"
    uid = bind(s, "p", "v100-25", gpu_node("a", 0, inventory=[Card("GPU-0", 0, V100, 32768)]))
    s.filter(ExtenderArgs(pod("q"), ["a"], [gpu_node("a", 0, inventory=[Card("GPU-0", 0, pcie, 32768)])]))
    assert (s.ledger.gpus["GPU-0"].model, s.ledger.gpus["GPU-0"].withdrawn) == (V100, True)
    s.release(uid)
    assert (s.ledger.gpus["GPU-0"].model, s.ledger.gpus["GPU-0"].withdrawn) == (pcie, False)


def test_a_node_with_a_broken_annotation_fails_the_pod_unresolvably_and_a_refused_one_changes_nothing() -> None:
    s = state()
    node = gpu_node("a", 2)
    node["metadata"]["annotations"][INVENTORY_ANNOTATION] = "[{oops"
    out = s.filter(ExtenderArgs(pod("p", "v100-25"), ["a"], [node]))
    assert out.result.node_names == []
    assert "InvalidInventory" in out.result.unresolvable["a"]
    clash = gpu_node("b", 1, inventory=[Card("GPU-1", 0, V100, 32768)])
    twin = gpu_node("c", 2, inventory=[Card("GPU-2", 0, V100, 32768), Card("GPU-1", 1, V100, 32768)])
    out = s.filter(ExtenderArgs(pod("p", "v100-25"), ["b", "c"], [clash, twin]))
    assert "b" in s.ledger.nodes and "c" not in s.ledger.nodes and "GPU-2" not in s.ledger.gpus
    assert "already belongs" in out.result.unresolvable["c"]
    s.ledger.verify()


def test_enforcement_is_shown_per_node_and_allocation() -> None:
    s = state()
    bind(s, "p", "v100-25", gpu_node("labels", 1))
    bind(s, "q", "v100-25", gpu_node("agent", 0, inventory=[Card("GPU-9", 0, V100, 32768)]))
    view = s.snapshot()
    assert {n["name"]: n["enforcement"] for n in view["nodes"]} == {"labels": "none", "agent": "agent"}
    assert {a["node"]: a["enforcement"] for a in view["allocations"]} == {"labels": "none", "agent": "agent"}
    assert s.gauges()["nodes_by_enforcement"] == {"agent": 1, "none": 1}
