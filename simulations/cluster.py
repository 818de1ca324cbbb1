"""Simulated clusters: the ``packing`` ledger with a change log, built from node lists or card counts.

The simulator drives the very ``Ledger`` the extender uses. ``TrackedLedger`` only adds a log
of the nodes each mutation touched, so the scheduler model can re-score just those nodes
(see ``simulations.scheduler.KeyCache``) instead of the whole cluster on every arrival.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from packing.ledger import Allocation, Ledger, Node
from packing.node_fit import Taint
from packing.products import Catalog, Request, model_accepts
from simulations.traces import NodeSpec

# A concrete label matching the built-in catalog's "Tesla-V100-*-32GB" pattern.
DEFAULT_CARD_LABEL = "Tesla-V100-SXM2-32GB"
CARDS_PER_NODE = 8


class ClusterError(ValueError):
    """A cluster cannot be built as asked (no nodes, unknown card model, bad sizes)."""


class TrackedLedger(Ledger):
    """A ``Ledger`` that appends the name of every node a mutation touched to ``changes``."""

    def __init__(self) -> None:
        super().__init__()
        self.changes: list[str] = []

    def add_node(self, name: str, gpus: Iterable[tuple[str, str, int]] = (), cpu_milli: int | None = None,
                 memory_mib: int | None = None, order: int | None = None,
                 labels: dict[str, str] | None = None, taints: tuple[Taint, ...] = (),
                 unschedulable: bool = False, known: bool = True) -> Node:
        node = super().add_node(name, gpus, cpu_milli, memory_mib, order, labels, taints, unschedulable, known)
        self.changes.append(name)
        return node

    def set_facts(self, name: str, labels: dict[str, str], taints: tuple[Taint, ...] = (),
                  unschedulable: bool = False, known: bool = True) -> bool:
        changed = super().set_facts(name, labels, taints, unschedulable, known)
        if changed:
            self.changes.append(name)
        return changed

    def remove_node(self, name: str) -> list[Allocation]:
        dropped = super().remove_node(name)
        self.changes.append(name)
        return dropped

    def assign(self, claim: str, request: Request, node: str, gpus: tuple[str, ...],
               expires_at: float | None = None) -> Allocation:
        alloc = super().assign(claim, request, node, gpus, expires_at)
        self.changes.append(node)
        return alloc

    def release(self, claim: str) -> Allocation:
        alloc = super().release(claim)
        self.changes.append(alloc.node)
        return alloc


@dataclass(frozen=True, slots=True)
class CardModel:
    """How GPUs appear in the ledger: one label and memory for every card, or the trace's own."""

    label: str | None  # None: keep each node's own model label
    memory_mib: int


def card_model_for(catalog: Catalog, rounding: str, label: str = DEFAULT_CARD_LABEL) -> CardModel:
    """Free-form runs keep the trace's GPU models with no GPU memory; slice runs relabel every GPU
    as one catalog card (every GPU counts as one card, as in the FGD study)."""
    if rounding == "none":
        return CardModel(None, 0)
    memory = catalog.model_memory_mib(label)
    if memory is None:
        raise ClusterError(f"card model {label!r} is not in the catalog ({catalog.source}); pass --card-model")
    return CardModel(label, memory)


def card_model(catalog: Catalog, rounding: str, requests: Sequence[Request],
               label: str = DEFAULT_CARD_LABEL) -> CardModel:
    """The cards a run's requests need: catalog cards (every GPU relabelled ``label``) when they are
    slices or name products; the trace's own GPUs otherwise. ClusterError when neither can hold them."""
    if rounding == "slices" or any(r.product for r in requests):
        return card_model_for(catalog, "slices", label)
    with_memory = sum(1 for r in requests if r.memory_mib)
    if with_memory:
        raise ClusterError(f"{with_memory} free-form request(s) ask for GPU memory, but the node list gives the "
                           "cards' memory nowhere: name catalog products, or drop gpu_memory_mib")
    return CardModel(None, 0)


def check_models(requests: Sequence[Request], nodes: Sequence[NodeSpec], card: CardModel) -> None:
    """ClusterError when requests pin GPU models that no card of the cluster has (they could never run)."""
    labels = {card.label} if card.label is not None else {n.model for n in nodes if n.gpus}
    pins = Counter(r.model for r in requests if r.model is not None and not r.gpu_less)
    missing = sorted(p for p in pins if not any(model_accepts(p, label) for label in labels))
    if missing:
        count = sum(pins[p] for p in missing)
        raise ClusterError(f"{count} request(s) pin GPU model(s) no card of the cluster is: {', '.join(missing[:5])}"
                           f" (the cluster has {', '.join(sorted(labels)) or 'no GPUs'})")


def node_order(count: int, seed: int | None) -> list[int]:
    """The per-seed node order: a random permutation (kube-scheduler ties by node name, names
    prefixed per seed in the FGD artifact), or the identity without a seed."""
    order = list(range(count))
    if seed is not None:
        random.Random(seed).shuffle(order)
    return order


def build_ledger(nodes: Sequence[NodeSpec], card: CardModel, seed: int | None = None,
                 track_host: bool = True) -> TrackedLedger:
    """A ledger holding ``nodes``, in the per-seed node order.

    ``track_host`` False leaves CPU and RAM untracked (1-D slices, as in the queueing studies).
    """
    if not nodes:
        raise ClusterError("a cluster needs at least one node")
    ledger = TrackedLedger()
    for spec, order in zip(nodes, node_order(len(nodes), seed), strict=True):
        label = card.label or spec.model
        gpus = [(f"{spec.name}/gpu{i}", label, card.memory_mib) for i in range(spec.gpus)]
        ledger.add_node(
            spec.name,
            gpus,
            cpu_milli=spec.cpu_milli if track_host else None,
            memory_mib=spec.memory_mib if track_host else None,
            order=order,
        )
    return ledger


def card_nodes(cards: int, per_node: int = CARDS_PER_NODE, cpu_milli: int = 96000, memory_mib: int = 786432,
               label: str = DEFAULT_CARD_LABEL) -> list[NodeSpec]:
    """``cards`` cards, ``per_node`` to a node (the last node takes the remainder)."""
    if cards < 1 or per_node < 1:
        raise ClusterError(f"need at least one card and one card per node, got {cards} and {per_node}")
    out: list[NodeSpec] = []
    left = cards
    while left > 0:
        n = min(per_node, left)
        out.append(NodeSpec(f"node-{len(out):04d}", cpu_milli, memory_mib, n, label))
        left -= n
    return out
