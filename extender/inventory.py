"""A node's GPU inventory, read from its Node object (the cluster sync's watch, or a request body).

Two sources, the more precise first:

1. the node annotation ``gpuslice.io/inventory`` published by our node agent (the inventory record,
   ``packing.inventory``: one ``Card`` per GPU, strictly decoded). The cards keep their NVML UUIDs, so
   allocation records name the real GPUs, and the node counts as enforced: the agent hands each
   container its slice and caps it;
2. the labels NVIDIA GPU Feature Discovery puts on every GPU node: ``nvidia.com/gpu.product``
   (e.g. ``Tesla-V100-SXM2-32GB``), ``nvidia.com/gpu.count`` and ``nvidia.com/gpu.memory`` (MiB).
   Labels name no cards, so we synthesize stable ids ``<node>/gpu-<i>``, and nothing on such a
   node is known to enforce a slice: its enforcement is ``none``, and gpuslice says so.

Capacity is counted in the catalog's units: a card of a model the catalog knows has the catalog's
memory (a v100-25 is a quarter of the catalog's 32768 MiB, even if NVML reports 32510 MiB total);
the reported memory only sizes cards of models the catalog does not know.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from packing.constraints import node_facts
from packing.inventory import ANNOTATION, MAX_CARDS, MAX_TEXT, PRODUCT_LABEL, Card, InventoryError, decode
from packing.node_fit import NodeFacts
from packing.products import Catalog

COUNT_LABEL = "nvidia.com/gpu.count"
MEMORY_LABEL = "nvidia.com/gpu.memory"
DEFAULT_MODEL = "Tesla-V100-SXM2-32GB"
_WHOLE_NUMBER = re.compile(r"[0-9]{1,9}")  # ASCII digits only: str.isdigit() also takes "²", which int() refuses


class Enforcement(StrEnum):
    """Who makes a slice on this node real."""

    AGENT = "agent"  # the node agent published the inventory: it hands out and caps each slice
    NONE = "none"  # known only by labels: nothing on the node is known to enforce a cap or a share


UNKNOWN_FACTS = NodeFacts(known=False)  # a node seeded by name (``--nodes``): kube-scheduler knows its labels


@dataclass(frozen=True, slots=True)
class NodeInventory:
    """A node's cards, in the order of their index, who enforces slices there, and its labels, taints
    and cordon (what the queue checks a pod's node constraints against)."""

    cards: tuple[Card, ...]
    enforcement: Enforcement
    facts: NodeFacts = UNKNOWN_FACTS  # read from the Node object when there is one (inventory_of_node)


def _card_memory(catalog: Catalog, model: str, reported: int) -> int:
    known = catalog.model_memory_mib(model)
    return known if known is not None else reported


def parse_inventory(value: str, catalog: Catalog) -> tuple[Card, ...]:
    """The agent's ``gpuslice.io/inventory`` annotation, in catalog units; InventoryError when malformed."""
    return tuple(replace(c, memory_mib=_card_memory(catalog, c.model, c.memory_mib)) for c in decode(value))


def _label_int(labels: Mapping[str, Any], key: str) -> int | None:
    raw = labels.get(key)
    if raw is None:
        return None
    if not isinstance(raw, str) or not _WHOLE_NUMBER.fullmatch(raw.strip()):
        raise InventoryError(f"label {key}={str(raw)[:40]!r} is not a whole number")
    return int(raw)


def synthetic_cards(node: str, count: int, model: str, memory_mib: int) -> tuple[Card, ...]:
    """``count`` cards with stable ids ``<node>/gpu-<i>`` (labels name no cards)."""
    return tuple(Card(f"{node}/gpu-{i}", i, model, memory_mib) for i in range(count))


def source_of(node: Mapping[str, Any]) -> tuple[object, ...]:
    """The raw fields the inventory is computed from: equal sources give equal inventories."""
    meta = node.get("metadata")
    if not isinstance(meta, dict):
        return (None, None, None, None)
    labels = meta.get("labels")
    annotations = meta.get("annotations")
    labels = labels if isinstance(labels, dict) else {}
    annotations = annotations if isinstance(annotations, dict) else {}
    return (annotations.get(ANNOTATION), labels.get(PRODUCT_LABEL), labels.get(COUNT_LABEL),
            labels.get(MEMORY_LABEL))


def inventory_of_node(name: str, node: Mapping[str, Any], catalog: Catalog) -> NodeInventory:
    """The GPUs of a Node object: the agent's annotation, else the GFD labels, else none."""
    annotation, product, count_label, memory_label = source_of(node)
    facts = node_facts(node)
    if annotation is not None:
        if not isinstance(annotation, str):
            raise InventoryError(f"{ANNOTATION} must be a string")
        return NodeInventory(parse_inventory(annotation, catalog), Enforcement.AGENT, facts)
    if product is None:
        return NodeInventory((), Enforcement.NONE, facts)
    if not isinstance(product, str) or not product or len(product) > MAX_TEXT:
        raise InventoryError(f"label {PRODUCT_LABEL} must be a non-empty string of at most {MAX_TEXT} characters")
    labels = {COUNT_LABEL: count_label, MEMORY_LABEL: memory_label}
    count = _label_int(labels, COUNT_LABEL)
    count = 1 if count is None else count
    if count > MAX_CARDS:
        raise InventoryError(f"label {COUNT_LABEL}={count} is more than {MAX_CARDS} cards")
    reported = _label_int(labels, MEMORY_LABEL) or 0
    return NodeInventory(synthetic_cards(name, count, product, _card_memory(catalog, product, reported)),
                         Enforcement.NONE, facts)
