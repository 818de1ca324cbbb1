"""A node's GPU inventory, read from its Node object (the cluster sync's watch, or a request body).

Two sources, the more precise first:

1. the node annotation ``gpuslice.io/inventory`` published by our node agent: a JSON list, one
   entry per card, ``{"uuid": "GPU-…", "index": 0, "model": "Tesla-V100-SXM2-32GB",
   "memory_mib": 32768, "healthy": true}`` (``index`` and ``healthy`` optional; healthy by
   default). The cards keep their NVML UUIDs, so allocation records name the real GPUs, and the
   node counts as enforced: the agent hands each container its slice and caps it;
2. the labels NVIDIA GPU Feature Discovery puts on every GPU node: ``nvidia.com/gpu.product``
   (e.g. ``Tesla-V100-SXM2-32GB``), ``nvidia.com/gpu.count`` and ``nvidia.com/gpu.memory`` (MiB).
   Labels name no cards, so we synthesize stable ids ``<node>/gpu-<i>``, and nothing on such a
   node is known to enforce a slice: its enforcement is ``none``, and gpuslice says so.

Every field is checked (type, range, duplicates); an entry's unknown fields are ignored, so a newer
agent that publishes more does not make an older extender distrust the node.

Capacity is counted in the catalog's units: a card of a model the catalog knows has the catalog's
memory (a v100-25 is a quarter of the catalog's 32768 MiB, even if NVML reports 32510 MiB total);
the reported memory only sizes cards of models the catalog does not know.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from extender.constraints import node_facts
from packing.node_fit import NodeFacts
from packing.products import Catalog

INVENTORY_ANNOTATION = "gpuslice.io/inventory"
PRODUCT_LABEL = "nvidia.com/gpu.product"
COUNT_LABEL = "nvidia.com/gpu.count"
MEMORY_LABEL = "nvidia.com/gpu.memory"
MAX_CARDS = 64  # far above any real node; bounds what one bad annotation can cost
MAX_TEXT = 256  # uuid and model lengths: NVML's are below 100
DEFAULT_MODEL = "Tesla-V100-SXM2-32GB"
_WHOLE_NUMBER = re.compile(r"[0-9]{1,9}")  # ASCII digits only: str.isdigit() also takes "²", which int() refuses


class InventoryError(ValueError):
    """A node's inventory annotation or GPU labels are malformed."""


class Enforcement(StrEnum):
    """Who makes a slice on this node real."""

    AGENT = "agent"  # the node agent published the inventory: it hands out and caps each slice
    NONE = "none"  # known only by labels: nothing on the node is known to enforce a cap or a share


@dataclass(frozen=True, slots=True)
class Card:
    """One GPU as the ledger sees it: (uuid, model label, memory in MiB), and whether it is healthy."""

    uuid: str
    model: str
    memory_mib: int
    healthy: bool = True

    def as_tuple(self) -> tuple[str, str, int]:
        return (self.uuid, self.model, self.memory_mib)


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
    """Decode the agent's ``gpuslice.io/inventory`` annotation; InventoryError when malformed."""
    try:
        doc = json.loads(value)
    except (ValueError, RecursionError):  # ValueError: not JSON, or a number of more than 4 300 digits
        raise InventoryError(f"{INVENTORY_ANNOTATION} is not JSON") from None
    if not isinstance(doc, list) or len(doc) > MAX_CARDS:
        raise InventoryError(f"{INVENTORY_ANNOTATION} must be a JSON list of at most {MAX_CARDS} cards")
    cards: list[tuple[int, Card]] = []
    for i, entry in enumerate(doc):
        where = f"{INVENTORY_ANNOTATION}[{i}]"
        if not isinstance(entry, dict):
            raise InventoryError(f"{where} must be an object")
        uuid, model, mib = entry.get("uuid"), entry.get("model"), entry.get("memory_mib")
        if not isinstance(uuid, str) or not uuid or not isinstance(model, str) or not model:
            raise InventoryError(f"{where} needs non-empty strings uuid and model")
        if len(uuid) > MAX_TEXT or len(model) > MAX_TEXT:
            raise InventoryError(f"{where}: uuid and model must be at most {MAX_TEXT} characters")
        if isinstance(mib, bool) or not isinstance(mib, int) or not 0 < mib < 2**40:
            raise InventoryError(f"{where}.memory_mib must be a positive integer")
        index = entry.get("index", i)
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < MAX_CARDS:
            raise InventoryError(f"{where}.index must be an integer within 0..{MAX_CARDS - 1}")
        healthy = entry.get("healthy", True)
        if not isinstance(healthy, bool):
            raise InventoryError(f"{where}.healthy must be true or false")
        cards.append((index, Card(uuid, model, _card_memory(catalog, model, mib), healthy)))
    if len({c.uuid for _, c in cards}) != len(cards):
        raise InventoryError(f"{INVENTORY_ANNOTATION} names a GPU uuid twice")
    if len({index for index, _ in cards}) != len(cards):
        raise InventoryError(f"{INVENTORY_ANNOTATION} names a GPU index twice")
    return tuple(c for _, c in sorted(cards, key=lambda x: x[0]))


def encode_inventory(cards: list[Card] | tuple[Card, ...]) -> str:
    """The annotation value for ``cards`` (what the node agent publishes)."""
    return json.dumps([{"uuid": c.uuid, "index": i, "model": c.model, "memory_mib": c.memory_mib,
                        "healthy": c.healthy} for i, c in enumerate(cards)], separators=(",", ":"))


def _label_int(labels: Mapping[str, Any], key: str) -> int | None:
    raw = labels.get(key)
    if raw is None:
        return None
    if not isinstance(raw, str) or not _WHOLE_NUMBER.fullmatch(raw.strip()):
        raise InventoryError(f"label {key}={str(raw)[:40]!r} is not a whole number")
    return int(raw)


def synthetic_cards(node: str, count: int, model: str, memory_mib: int) -> tuple[Card, ...]:
    """``count`` cards with stable ids ``<node>/gpu-<i>`` (labels name no cards)."""
    return tuple(Card(f"{node}/gpu-{i}", model, memory_mib) for i in range(count))


def source_of(node: Mapping[str, Any]) -> tuple[object, ...]:
    """The raw fields the inventory is computed from: equal sources give equal inventories."""
    meta = node.get("metadata")
    if not isinstance(meta, dict):
        return (None, None, None, None)
    labels = meta.get("labels")
    annotations = meta.get("annotations")
    labels = labels if isinstance(labels, dict) else {}
    annotations = annotations if isinstance(annotations, dict) else {}
    return (annotations.get(INVENTORY_ANNOTATION), labels.get(PRODUCT_LABEL), labels.get(COUNT_LABEL),
            labels.get(MEMORY_LABEL))


def inventory_of_node(name: str, node: Mapping[str, Any], catalog: Catalog) -> NodeInventory:
    """The GPUs of a Node object: the agent's annotation, else the GFD labels, else none."""
    annotation, product, count_label, memory_label = source_of(node)
    facts = node_facts(node)
    if annotation is not None:
        if not isinstance(annotation, str):
            raise InventoryError(f"{INVENTORY_ANNOTATION} must be a string")
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
