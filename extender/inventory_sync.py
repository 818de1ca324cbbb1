"""Inventory sync: make the ledger's view of each node what its Node object says, as far as it safely can.

Where inventories come from: the cluster sync's node watch (cluster mode: the only source), the
``--nodes`` seed, and, only with ``--learn-nodes`` in standalone mode, the Node objects of request
bodies (``learn``). How a new inventory is applied to a node that already holds slices:

* a card that appears is added at once; a card that turns unhealthy is withdrawn at once (nothing
  new is placed on it; what it holds stays accounted) and comes back when it is healthy again;
* a card that disappears is removed at once if it holds nothing, else withdrawn until its slices
  leave, then removed;
* a card whose model or memory changed is replaced at once if it holds nothing, else kept as it was
  (withdrawn) until it does.

A node's labels, taints and cordon (``spec.unschedulable``) apply at once: they decide where the queue
places new claims, never what a node already holds.

What cannot be applied yet stays the node's wanted inventory and is applied as soon as the node can
take it: ``settle`` runs after every release on a node with such a change. Each change is one
transaction of the cache (``undo_on_error``): an inventory the ledger refuses (a GPU uuid another
node holds) changes nothing and marks the node ``InvalidInventory``, as a malformed one does.

Every method expects the caller to hold the cache's lock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Any

from extender.cache import ClaimCache
from extender.decide import REASON_HEAD, UNKNOWN, Code, FitNote
from extender.inventory import Enforcement, NodeInventory, inventory_of_node, source_of
from packing.constraints import node_facts
from packing.inventory import InventoryError
from packing.ledger import LedgerError
from packing.products import Catalog

Spec = tuple[str, str, int, bool]  # (uuid, model, memory MiB, withdrawn)


class SyncOutcome(StrEnum):
    ADDED = "added"
    REPLACED = "replaced"  # cards added, removed or changed
    WITHDRAWN = "withdrawn"  # only cards' health changed
    REMOVED = "removed"
    RELABELED = "relabeled"  # only labels, taints or cordon changed
    SAME = "same"
    PENDING = "pending"  # applied as far as it can; the rest waits for slices to leave
    INVALID = "invalid"  # the ledger refused it: nothing changed


class InventorySync:
    """The wanted inventory of every node, applied to the ledger through the cache."""

    def __init__(self, cache: ClaimCache, catalog: Catalog) -> None:
        self.cache = cache
        self.catalog = catalog
        self._want: dict[str, NodeInventory] = {}
        self._pending: set[str] = set()  # nodes whose wanted inventory is not fully applied yet
        self._bad: dict[str, str] = {}  # node -> why its inventory could not be read or applied
        self._sources: dict[str, tuple[object, ...]] = {}  # node -> raw fields last learned from a body

    # ---- changes ---------------------------------------------------------------------------------

    def sync(self, name: str, inventory: NodeInventory) -> SyncOutcome:
        """Apply ``inventory`` to ``name`` as far as its slices allow (the rest is applied by ``settle``)."""
        try:
            with self.cache.undo_on_error():
                outcome = self._apply(name, inventory)
        except LedgerError as e:
            self._bad[name] = str(e)
            return SyncOutcome.INVALID
        self._want[name] = inventory
        self._bad.pop(name, None)
        return outcome

    def settle(self, name: str) -> SyncOutcome | None:
        """A slice left ``name``: apply its waiting inventory change now if there is one."""
        if name not in self._pending or name not in self._want:
            return None
        return self.sync(name, self._want[name])

    def mark_bad(self, name: str, why: str) -> None:
        """``name``'s inventory cannot be read: filter shows why; its last good view stays in the ledger."""
        self._bad[name] = why

    def forget(self, name: str) -> None:
        """The node left the cluster (the caller drops it from the ledger)."""
        self._want.pop(name, None)
        self._pending.discard(name)
        self._bad.pop(name, None)
        self._sources.pop(name, None)

    def clear(self) -> None:
        self._want.clear()
        self._pending.clear()
        self._bad.clear()
        self._sources.clear()

    def learn(self, nodes: Sequence[Mapping[str, Any]], names: Sequence[str]) -> None:
        """Take inventories from the Node objects of a request body (standalone ``--learn-nodes`` only)."""
        for name, node in zip(names, nodes, strict=True):
            source = (*source_of(node), node_facts(node))
            if self._sources.get(name) == source:
                continue
            try:
                inventory = inventory_of_node(name, node, self.catalog)
            except InventoryError as e:
                self._bad[name] = str(e)
            else:
                self.sync(name, inventory)
            self._sources[name] = source

    def _apply(self, name: str, want: NodeInventory) -> SyncOutcome:
        outcome = self._apply_cards(name, want)
        if name in self.cache.ledger.nodes and self.cache.set_facts(name, want.facts) \
                and outcome is SyncOutcome.SAME:
            return SyncOutcome.RELABELED
        return outcome

    def _apply_cards(self, name: str, want: NodeInventory) -> SyncOutcome:
        cache = self.cache
        node = cache.ledger.nodes.get(name)
        self._pending.discard(name)
        if node is None:
            if not want.cards:
                return SyncOutcome.SAME
            cache.add_node(name, [c.as_tuple() for c in want.cards])
            for c in want.cards:
                if not c.healthy:
                    cache.withdraw(c.uuid)
            return SyncOutcome.ADDED
        target, pending = _target(node.gpus, want)
        if pending:
            self._pending.add(name)
        now = [(g.uuid, g.model, g.memory_mib, g.withdrawn) for g in node.gpus]
        if target == now:
            return SyncOutcome.PENDING if pending else SyncOutcome.SAME
        if [t[:3] for t in target] == [n[:3] for n in now]:
            for uuid, _, _, withdrawn in target:
                cache.withdraw(uuid, withdrawn)
            return SyncOutcome.PENDING if pending else SyncOutcome.WITHDRAWN
        if not target:
            cache.remove_node(name)  # nothing on it held a slice, or a card would still be listed
            return SyncOutcome.REMOVED
        busy = cache.node_allocations(name) if any(not g.empty for g in node.gpus) else []
        order = node.order
        cache.remove_node(name)
        cache.add_node(name, [t[:3] for t in target], order=order)
        for alloc in busy:
            cache.readmit(alloc)
        for uuid, _, _, withdrawn in target:
            if withdrawn:
                cache.withdraw(uuid)
        return SyncOutcome.PENDING if pending else SyncOutcome.REPLACED

    # ---- views -----------------------------------------------------------------------------------

    def unknown(self, name: str) -> FitNote:
        """Why a node the ledger does not hold fails every pod that asks for a slice."""
        bad = self._bad.get(name)
        if bad is not None:
            return FitNote(Code.INVALID_INVENTORY, f"{REASON_HEAD}{Code.INVALID_INVENTORY.value}: {bad}", False)
        return UNKNOWN

    def enforcement(self, name: str) -> Enforcement:
        """Who enforces slices on ``name``: the agent when it published the inventory, else nobody."""
        want = self._want.get(name)
        return want.enforcement if want is not None else Enforcement.NONE

    def pending(self, name: str) -> bool:
        return name in self._pending

    def bad(self) -> dict[str, str]:
        return dict(sorted(self._bad.items()))

    def by_enforcement(self) -> Counter[Enforcement]:
        """Nodes in the ledger by who enforces their slices."""
        counts: Counter[Enforcement] = Counter({e: 0 for e in Enforcement})
        for name in self.cache.ledger.nodes:
            counts[self.enforcement(name)] += 1
        return counts


def _target(gpus: Sequence[Any], want: NodeInventory) -> tuple[list[Spec], bool]:
    """The cards ``name`` should have now, given what its busy cards still hold; and whether more waits."""
    current = {g.uuid: g for g in gpus}
    target: list[Spec] = []
    pending = False
    for c in want.cards:
        g = current.get(c.uuid)
        if g is not None and not g.empty and (g.model, g.memory_mib) != (c.model, c.memory_mib):
            target.append((g.uuid, g.model, g.memory_mib, True))  # changed under a slice: as it was, withdrawn
            pending = True
        else:
            target.append((c.uuid, c.model, c.memory_mib, not c.healthy))
    wanted = {c.uuid for c in want.cards}
    for g in gpus:
        if g.uuid not in wanted and not g.empty:
            target.append((g.uuid, g.model, g.memory_mib, True))  # gone but still holding a slice
            pending = True
    return target, pending
