"""GPU inventory from Node objects: the agent's annotation, GPU Feature Discovery labels, learning."""

from __future__ import annotations

import json

import pytest

from extender.inventory import (
    INVENTORY_ANNOTATION,
    Card,
    InventoryError,
    cards_of_node,
    encode_inventory,
    parse_inventory,
)
from extender.samples import gpu_node, pod
from extender.standalone import MemoryBinder
from extender.state import ExtenderState
from extender.wire import BindingArgs, ExtenderArgs
from packing.products import load_catalog

CATALOG = load_catalog()
V100 = "Tesla-V100-SXM2-32GB"


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


def test_the_agents_inventory_annotation_wins_over_labels() -> None:
    inventory = [Card("GPU-aaa", V100, 32768), Card("GPU-bbb", "Tesla-V100-PCIE-32GB", 32768)]
    node = gpu_node("n1", 8, inventory=inventory)
    assert cards_of_node("n1", node, CATALOG) == tuple(inventory)
    assert parse_inventory(encode_inventory(inventory), CATALOG) == tuple(inventory)


def test_a_node_without_gpu_labels_has_no_cards() -> None:
    assert cards_of_node("cpu", gpu_node("cpu", 0), CATALOG) == ()
    assert cards_of_node("bare", {"metadata": {"name": "bare"}}, CATALOG) == ()
    only_product = gpu_node("n", 1)
    del only_product["metadata"]["labels"]["nvidia.com/gpu.count"]
    assert len(cards_of_node("n", only_product, CATALOG)) == 1


@pytest.mark.parametrize("value, needle", [
    ("not json", "not JSON"),
    ('{"uuid": "x"}', "JSON list"),
    ('[{"uuid": "x", "model": "m"}]', "memory_mib"),
    ('[{"uuid": "", "model": "m", "memory_mib": 1}]', "uuid and model"),
    ('[{"uuid": "x", "model": "m", "memory_mib": 1}, {"uuid": "x", "model": "m", "memory_mib": 1}]', "twice"),
    (json.dumps([{"uuid": f"g{i}", "model": "m", "memory_mib": 1} for i in range(65)]), "at most"),
])
def test_malformed_annotations_are_inventory_errors(value: str, needle: str) -> None:
    with pytest.raises(InventoryError, match=needle):
        parse_inventory(value, CATALOG)


def test_malformed_labels_are_inventory_errors() -> None:
    node = gpu_node("n", 2)
    node["metadata"]["labels"]["nvidia.com/gpu.count"] = "two"
    with pytest.raises(InventoryError, match=r"gpu\.count"):
        cards_of_node("n", node, CATALOG)


# ---- learning in full-Nodes mode -----------------------------------------------------------------


def state() -> ExtenderState:
    return ExtenderState(CATALOG, MemoryBinder(), clock=lambda: 100.0)  # a still clock: deadlines repeat


def test_full_nodes_teach_the_ledger_and_unchanged_nodes_cost_nothing() -> None:
    s = state()
    nodes = [gpu_node("a", 2), gpu_node("b", 1), gpu_node("cpu", 0)]
    out = s.filter(ExtenderArgs(pod("p", "v100-100"), ["a", "b", "cpu"], nodes))
    assert sorted(s.ledger.nodes) == ["a", "b"]
    assert out.result.node_names == ["b"]  # best fit: the node with fewest empty cards
    assert "cpu" in out.result.unresolvable
    before = s.ledger.fingerprint()
    s.filter(ExtenderArgs(pod("p", "v100-100"), ["a", "b", "cpu"], nodes))
    assert s.ledger.fingerprint() == before


def test_a_changed_inventory_replaces_an_idle_node_but_never_drops_live_allocations() -> None:
    s = state()
    s.filter(ExtenderArgs(pod("idle", None), ["a", "b"], [gpu_node("a", 2), gpu_node("b", 2)]))
    p = pod("p", "v100-50")
    out = s.filter(ExtenderArgs(p, ["a"], [gpu_node("a", 2)]))
    assert s.bind(BindingArgs("p", "default", p["metadata"]["uid"], out.result.node_names[0])).ok
    s.filter(ExtenderArgs(pod("q"), ["a", "b"], [gpu_node("a", 4), gpu_node("b", 4)]))
    assert len(s.ledger.nodes["a"].gpus) == 2  # holds p's slice: kept as it was
    assert len(s.ledger.nodes["b"].gpus) == 4  # idle: replaced
    s.ledger.verify()


def test_a_node_with_a_broken_annotation_fails_the_pod_unresolvably_with_the_reason() -> None:
    s = state()
    node = gpu_node("a", 2)
    node["metadata"]["annotations"][INVENTORY_ANNOTATION] = "[{oops"
    out = s.filter(ExtenderArgs(pod("p", "v100-25"), ["a"], [node]))
    assert out.result.node_names == []
    assert "InvalidInventory" in out.result.unresolvable["a"]
    clash = gpu_node("b", 1, inventory=[Card("GPU-1", V100, 32768)])
    twin = gpu_node("c", 1, inventory=[Card("GPU-1", V100, 32768)])
    out = s.filter(ExtenderArgs(pod("p", "v100-25"), ["b", "c"], [clash, twin]))
    assert "b" in s.ledger.nodes and "c" not in s.ledger.nodes
    assert "already belongs" in out.result.unresolvable["c"]
