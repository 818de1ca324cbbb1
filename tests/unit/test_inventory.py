"""The inventory record: one Card, encoded by the agent and decoded by the extender, strict and round-tripping."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packing.inventory import ANNOTATION, MAX_CARDS, MAX_TEXT, Card, InventoryError, decode, encode

V100 = "Tesla-V100-SXM2-32GB"
texts = st.text(min_size=1, max_size=MAX_TEXT)


@st.composite
def inventories(draw: st.DrawFn) -> list[Card]:
    uuids = draw(st.lists(texts, max_size=8, unique=True))
    indexes = draw(st.permutations(range(MAX_CARDS)))[: len(uuids)]
    return [Card(u, i, draw(texts), draw(st.integers(1, 2**40 - 1)), draw(st.booleans()))
            for u, i in zip(uuids, indexes, strict=True)]


def test_the_annotation_and_its_form() -> None:
    assert ANNOTATION == "gpuslice.io/inventory"
    cards = [Card("GPU-b", 1, V100, 32510, healthy=False), Card("GPU-a", 0, V100, 32510)]
    assert encode(cards) == ('[{"uuid":"GPU-a","index":0,"model":"Tesla-V100-SXM2-32GB","memory_mib":32510,'
                             '"healthy":true},{"uuid":"GPU-b","index":1,"model":"Tesla-V100-SXM2-32GB",'
                             '"memory_mib":32510,"healthy":false}]')


@given(inventories())
@settings(max_examples=200)
def test_round_trip_in_index_order(cards: list[Card]) -> None:
    text = encode(cards)
    assert decode(text) == tuple(sorted(cards, key=lambda c: c.index))
    assert encode(decode(text)) == text  # equal inventories encode to equal strings


def test_index_and_health_default_and_unknown_fields_are_ignored() -> None:
    value = json.dumps([{"uuid": "GPU-a", "model": V100, "memory_mib": 32510, "serial": "a newer agent's field"},
                        {"uuid": "GPU-b", "index": 1, "model": V100, "memory_mib": 32510, "healthy": False}])
    assert decode(value) == (Card("GPU-a", 0, V100, 32510), Card("GPU-b", 1, V100, 32510, healthy=False))


def test_the_encoder_refuses_what_the_decoder_would() -> None:
    with pytest.raises(InventoryError, match="uuid twice"):
        encode([Card("GPU-a", 0, V100, 1), Card("GPU-a", 1, V100, 1)])
    with pytest.raises(InventoryError, match="index twice"):
        encode([Card("GPU-a", 0, V100, 1), Card("GPU-b", 0, V100, 1)])
    for bad in (("", 0, V100, 1), ("x", MAX_CARDS, V100, 1), ("x", 0, V100, 0), ("x", 0, "m" * (MAX_TEXT + 1), 1),
                ("x", True, V100, 1)):
        with pytest.raises(InventoryError):
            Card(*bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("value, needle", [
    ("not json", "not JSON"),
    ('{"uuid": "x"}', "JSON list"),
    ('[{"uuid": "x", "model": "m"}]', "memory_mib"),
    ('[{"uuid": "", "model": "m", "memory_mib": 1}]', "uuid and model"),
    ('[{"uuid": "x", "model": "m", "memory_mib": 1}, {"uuid": "x", "model": "m", "memory_mib": 1}]', "twice"),
    (json.dumps([{"uuid": f"g{i}", "model": "m", "memory_mib": 1} for i in range(65)]), "at most"),
    ('[{"uuid": "x", "model": "m", "memory_mib": 1, "index": -1}]', "index"),
    ('[{"uuid": "x", "model": "m", "memory_mib": 1, "index": true}]', "index"),
    ('[{"uuid": "x", "model": "m", "memory_mib": 1, "index": 0}, {"uuid": "y", "model": "m", "memory_mib": 1, '
     '"index": 0}]', "index twice"),
    ('[{"uuid": "x", "model": "m", "memory_mib": 1, "healthy": "yes"}]', "healthy"),
    ('[{"uuid": "x", "model": "m", "memory_mib": 1.5}]', "memory_mib"),
    ('[{"uuid": "x", "model": "m", "memory_mib": ' + "9" * 5000 + "}]", "not JSON"),
])
def test_malformed_annotations_are_inventory_errors(value: str, needle: str) -> None:
    with pytest.raises(InventoryError, match=needle):
        decode(value)



json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)


@given(st.lists(st.dictionaries(st.sampled_from(["uuid", "index", "model", "memory_mib", "healthy", "x"]),
                                json_values | st.integers(-1, 70), max_size=6), max_size=4) | json_values)
@settings(max_examples=300)
def test_any_json_decodes_or_raises_inventory_error(doc: object) -> None:
    try:
        cards = decode(json.dumps(doc))
    except InventoryError:
        return
    assert decode(encode(cards)) == cards


def test_the_agents_readings_reach_the_extender_in_catalog_units() -> None:
    """Both edges on the one record: what the agent publishes, the extender reads back."""
    from enforcement.inventory import Reading
    from extender.inventory import Enforcement, inventory_of_node
    from extender.samples import gpu_node
    from packing.products import load_catalog

    agent = [Reading(Card("GPU-b", 1, V100, 32510, healthy=False), 1, "Xid 79"),
             Reading(Card("GPU-a", 0, V100, 32510), 0)]
    node = gpu_node("n1", 2)
    node["metadata"]["annotations"][ANNOTATION] = encode(r.card for r in agent)
    inventory = inventory_of_node("n1", node, load_catalog())
    assert inventory.enforcement is Enforcement.AGENT
    assert [(c.uuid, c.healthy, c.memory_mib) for c in inventory.cards] == [("GPU-a", True, 32768),
                                                                           ("GPU-b", False, 32768)]
