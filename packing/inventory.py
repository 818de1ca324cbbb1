"""The inventory record: a node's GPUs as its agent publishes them, the contract between the agent and the extender.

The node agent reads its cards through NVML and writes them on its Node as the annotation
``gpuslice.io/inventory``, a JSON list, one entry per card, in NVML index order::

    {"uuid": "GPU-…", "index": 0, "model": "Tesla-V100-SXM2-32GB", "memory_mib": 32768, "healthy": true}

``model`` is NVML's name in GPU Feature Discovery's label form (``nvidia.com/gpu.product``), so the
extender's catalog matches it as it matches the labels; allocation records name the ``uuid``s. The
extender reads it back with :func:`decode`, which checks every field (type, range, duplicates) and
ignores an entry's unknown fields, so a newer agent that publishes more does not make an older
extender distrust the node; ``index`` and ``healthy`` may be absent (position, true).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

ANNOTATION = "gpuslice.io/inventory"
PRODUCT_LABEL = "nvidia.com/gpu.product"  # GPU Feature Discovery's model label: ``model`` is in its form
MAX_CARDS = 64  # far above any real node; bounds what one bad annotation can cost
MAX_TEXT = 256  # uuid and model lengths: NVML's are below 100
MAX_MEMORY_MIB = 2**40


class InventoryError(ValueError):
    """An inventory annotation (or a card) that is not a valid inventory record."""


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class Card:
    """One GPU of a node: NVML's UUID, its index there, its model (GFD label form), its memory, its health."""

    uuid: str
    index: int
    model: str
    memory_mib: int
    healthy: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.uuid, str) or not self.uuid or not isinstance(self.model, str) or not self.model:
            raise InventoryError("a card needs non-empty strings uuid and model")
        if len(self.uuid) > MAX_TEXT or len(self.model) > MAX_TEXT:
            raise InventoryError(f"a card's uuid and model are at most {MAX_TEXT} characters")
        if not _integer(self.index) or not 0 <= self.index < MAX_CARDS:
            raise InventoryError(f"a card's index is an integer within 0..{MAX_CARDS - 1}")
        if not _integer(self.memory_mib) or not 0 < self.memory_mib < MAX_MEMORY_MIB:
            raise InventoryError("a card's memory_mib is a positive integer")
        if not isinstance(self.healthy, bool):
            raise InventoryError("a card's healthy is true or false")

    def as_tuple(self) -> tuple[str, str, int]:
        """(uuid, model, memory in MiB): the card as the ledger takes it."""
        return (self.uuid, self.model, self.memory_mib)

    def entry(self) -> dict[str, Any]:
        return {"uuid": self.uuid, "index": self.index, "model": self.model, "memory_mib": self.memory_mib,
                "healthy": self.healthy}


def _checked(cards: Iterable[Card]) -> tuple[Card, ...]:
    ordered = tuple(sorted(cards, key=lambda c: c.index))
    if len(ordered) > MAX_CARDS:
        raise InventoryError(f"{ANNOTATION} lists at most {MAX_CARDS} cards")
    if len({c.uuid for c in ordered}) != len(ordered):
        raise InventoryError(f"{ANNOTATION} names a GPU uuid twice")
    if len({c.index for c in ordered}) != len(ordered):
        raise InventoryError(f"{ANNOTATION} names a GPU index twice")
    return ordered


def encode(cards: Iterable[Card]) -> str:
    """The annotation value: compact JSON, cards in index order; InventoryError for a list ``decode``
    would refuse (a uuid or an index twice, too many cards)."""
    return json.dumps([c.entry() for c in _checked(cards)], separators=(",", ":"))


def decode(value: str) -> tuple[Card, ...]:
    """The cards of an annotation value, in index order; InventoryError says what is wrong."""
    if not isinstance(value, str):
        raise InventoryError(f"{ANNOTATION} must be a string")
    try:
        doc = json.loads(value)
    except (ValueError, RecursionError):  # ValueError: not JSON, or a number of more than 4 300 digits
        raise InventoryError(f"{ANNOTATION} is not JSON") from None
    if not isinstance(doc, list) or len(doc) > MAX_CARDS:
        raise InventoryError(f"{ANNOTATION} must be a JSON list of at most {MAX_CARDS} cards")
    cards: list[Card] = []
    for i, entry in enumerate(doc):
        if not isinstance(entry, dict):
            raise InventoryError(f"{ANNOTATION}[{i}] must be an object")
        try:
            cards.append(Card(entry.get("uuid"), entry.get("index", i), entry.get("model"),  # type: ignore[arg-type]
                              entry.get("memory_mib"), entry.get("healthy", True)))  # type: ignore[arg-type]
        except InventoryError as e:
            raise InventoryError(f"{ANNOTATION}[{i}]: {e}") from None
    return _checked(cards)
