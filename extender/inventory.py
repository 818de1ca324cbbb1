"""A node's GPU inventory, learned from the Node object kube-scheduler sends (full ``Nodes`` mode).

Two sources, the more precise first:

1. the node annotation ``gpuslice.io/inventory`` published by our node agent: a JSON list of
   ``{"uuid": "GPU-…", "model": "Tesla-V100-SXM2-32GB", "memory_mib": 32768}``, one per card;
2. the labels NVIDIA GPU Feature Discovery puts on every GPU node: ``nvidia.com/gpu.product``
   (e.g. ``Tesla-V100-SXM2-32GB``), ``nvidia.com/gpu.count`` and ``nvidia.com/gpu.memory`` (MiB).
   Labels name no cards, so we synthesize stable ids ``<node>/gpu-<i>``.

Capacity is counted in the catalog's units: a card of a model the catalog knows has the catalog's
memory (a v100-25 is a quarter of the catalog's 32768 MiB, even if NVML reports 32510 MiB total);
the reported memory only sizes cards of models the catalog does not know.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from packing.products import Catalog

INVENTORY_ANNOTATION = "gpuslice.io/inventory"
PRODUCT_LABEL = "nvidia.com/gpu.product"
COUNT_LABEL = "nvidia.com/gpu.count"
MEMORY_LABEL = "nvidia.com/gpu.memory"
MAX_CARDS = 64  # far above any real node; bounds what one bad annotation can cost
DEFAULT_MODEL = "Tesla-V100-SXM2-32GB"


class InventoryError(ValueError):
    """A node's inventory annotation or GPU labels are malformed."""


@dataclass(frozen=True, slots=True)
class Card:
    """One GPU as the ledger sees it: (uuid, model label, memory in MiB)."""

    uuid: str
    model: str
    memory_mib: int

    def as_tuple(self) -> tuple[str, str, int]:
        return (self.uuid, self.model, self.memory_mib)


def _card_memory(catalog: Catalog, model: str, reported: int) -> int:
    known = catalog.model_memory_mib(model)
    return known if known is not None else reported


def parse_inventory(value: str, catalog: Catalog) -> tuple[Card, ...]:
    """Decode the agent's ``gpuslice.io/inventory`` annotation; InventoryError when malformed."""
    try:
        doc = json.loads(value)
    except (json.JSONDecodeError, RecursionError):
        raise InventoryError(f"{INVENTORY_ANNOTATION} is not JSON") from None
    if not isinstance(doc, list) or len(doc) > MAX_CARDS:
        raise InventoryError(f"{INVENTORY_ANNOTATION} must be a JSON list of at most {MAX_CARDS} cards")
    cards: list[Card] = []
    for i, entry in enumerate(doc):
        if not isinstance(entry, dict):
            raise InventoryError(f"{INVENTORY_ANNOTATION}[{i}] must be an object")
        uuid, model, mib = entry.get("uuid"), entry.get("model"), entry.get("memory_mib")
        if not isinstance(uuid, str) or not uuid or not isinstance(model, str) or not model:
            raise InventoryError(f"{INVENTORY_ANNOTATION}[{i}] needs non-empty strings uuid and model")
        if isinstance(mib, bool) or not isinstance(mib, int) or mib <= 0:
            raise InventoryError(f"{INVENTORY_ANNOTATION}[{i}].memory_mib must be a positive integer")
        cards.append(Card(uuid, model, _card_memory(catalog, model, mib)))
    if len({c.uuid for c in cards}) != len(cards):
        raise InventoryError(f"{INVENTORY_ANNOTATION} names a GPU uuid twice")
    return tuple(cards)


def encode_inventory(cards: list[Card] | tuple[Card, ...]) -> str:
    """The annotation value for ``cards`` (what the node agent publishes)."""
    return json.dumps([{"uuid": c.uuid, "model": c.model, "memory_mib": c.memory_mib} for c in cards],
                      separators=(",", ":"))


def _label_int(labels: Mapping[str, Any], key: str) -> int | None:
    raw = labels.get(key)
    if raw is None:
        return None
    if not isinstance(raw, str) or not raw.strip().isdigit():
        raise InventoryError(f"label {key}={raw!r} is not a whole number")
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


def cards_of_node(name: str, node: Mapping[str, Any], catalog: Catalog) -> tuple[Card, ...]:
    """The GPUs of a Node object: the agent's annotation, else the GFD labels, else none."""
    annotation, product, count_label, memory_label = source_of(node)
    if annotation is not None:
        if not isinstance(annotation, str):
            raise InventoryError(f"{INVENTORY_ANNOTATION} must be a string")
        return parse_inventory(annotation, catalog)
    if product is None:
        return ()
    if not isinstance(product, str) or not product:
        raise InventoryError(f"label {PRODUCT_LABEL} must be a non-empty string")
    labels = {COUNT_LABEL: count_label, MEMORY_LABEL: memory_label}
    count = _label_int(labels, COUNT_LABEL)
    count = 1 if count is None else count
    if count > MAX_CARDS:
        raise InventoryError(f"label {COUNT_LABEL}={count} is more than {MAX_CARDS} cards")
    reported = _label_int(labels, MEMORY_LABEL) or 0
    return synthetic_cards(name, count, product, _card_memory(catalog, product, reported))
