"""The cluster ledger: GPUs per node, free capacity, and the allocation of every claim.

Invariants (checked by ``verify`` and the stateful property tests):

* a GPU is never over-committed: 0 <= free <= capacity, in milli and in MiB;
* every unit is accounted once: free + sum of allocations on a GPU = its capacity;
* the free-capacity indexes always equal a recomputation from the GPUs;
* every operation is all-or-nothing: one that raises leaves the ledger unchanged;
* ``release(place(x))`` restores the exact ledger, and so does ``readmit(release(x))``;
* a withdrawn GPU (gone from its node's inventory, or unhealthy) takes no new placement: it is in
  no free-capacity index and counts in no node's free capacity, while what it already holds stays
  accounted until it is released.

Best fit is a logarithmic look-up: GPUs sit in a ``SortedList`` per model, keyed by
(free milli, free milli of their node, node order, GPU index), so the first key at or above a
request's size is the tightest GPU, with ties going to the fullest node, then a stable order.

Readers that keep their own index over node capacity (``packing.key_index``) learn which nodes
changed from a ``ChangeFeed`` (``Ledger.feed``): O(feeds) per node change, held weakly.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from sortedcontainers import SortedList

from packing.node_fit import NodeConstraints, NodeFacts, Taint, may_run
from packing.products import MILLI_PER_GPU, Request
from packing.record import AllocationRecord


class LedgerError(Exception):
    """An operation the ledger refuses; the ledger is unchanged."""


class NoFit(LedgerError):
    """The request fits nowhere it was allowed to go."""

    def __init__(self, message: str, misfits: dict[str, Misfit] | None = None) -> None:
        super().__init__(message)
        self.misfits = misfits or {}


class UnknownClaim(LedgerError, KeyError):
    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else "unknown claim"


@dataclass(slots=True)
class Gpu:
    uuid: str
    node: str
    index: int
    model: str
    milli: int
    memory_mib: int
    free_milli: int
    free_mib: int
    withdrawn: bool = False  # takes no new placement (see ``Ledger.withdraw``)

    @property
    def empty(self) -> bool:
        return self.free_milli == self.milli and self.free_mib == self.memory_mib


@dataclass(slots=True)
class Node:
    name: str
    order: int
    gpus: list[Gpu]
    cpu_milli: int | None  # None: not tracked (the extender leaves CPU/RAM to kube-scheduler)
    memory_mib: int | None
    free_cpu: int = 0
    free_mem: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    facts: NodeFacts = field(default_factory=NodeFacts)  # labels, taints, cordon as node_fit reads them
    allowed: dict[NodeConstraints, bool] = field(default_factory=dict, repr=False, compare=False)  # memo of may_run

    @property
    def taints(self) -> tuple[Taint, ...]:
        return self.facts.taints

    @property
    def unschedulable(self) -> bool:
        """Cordoned: the queue places nothing new here unless the pod tolerates it."""
        return self.facts.unschedulable

    def allows(self, request: Request) -> bool:
        """May ``request``'s pod go here by its node constraints (``packing.node_fit``)? Memoised per
        constraints until the node's facts change."""
        c = request.constraints
        if c is None:
            return self.facts.open
        hit = self.allowed.get(c)
        if hit is None:
            if len(self.allowed) >= 256:
                self.allowed.clear()  # shapes come and go: keep the memo small
            hit = self.allowed[c] = may_run(c, self.name, self.facts)
        return hit

    @property
    def free_gpu_milli(self) -> int:
        return sum(g.free_milli for g in self.gpus if not g.withdrawn)

    @property
    def free_whole(self) -> int:
        return sum(1 for g in self.gpus if g.empty and not g.withdrawn)

    def largest_free_milli(self, request: Request | None = None) -> int:
        sizes = [g.free_milli for g in self.gpus
                 if not g.withdrawn and (request is None or request.accepts_model(g.model))]
        return max(sizes, default=0)


@dataclass(frozen=True, slots=True)
class GpuShare:
    uuid: str
    milli: int
    memory_mib: int


@dataclass(frozen=True, slots=True)
class Allocation:
    """One claim's hold on the ledger; ``expires_at`` is set while it is only reserved."""

    claim: str
    node: str
    shares: tuple[GpuShare, ...]
    request: Request
    expires_at: float | None = None

    @property
    def reserved(self) -> bool:
        return self.expires_at is not None

    @property
    def gpus(self) -> tuple[str, ...]:
        return tuple(s.uuid for s in self.shares)

    def record(self) -> AllocationRecord:
        return AllocationRecord(
            claim_uid=self.claim,
            node=self.node,
            gpus=self.gpus,
            product=self.request.product,
            milli=self.request.milli,
            memory_mib=self.request.memory_mib,
        )


@dataclass(frozen=True, slots=True)
class Misfit:
    """Why a request does not fit on one node. ``resolvable``: could freeing capacity help?"""

    code: str
    message: str
    resolvable: bool


GpuKey = tuple[int, int, int, int, str]
NodeKey = tuple[int, int, int, str]


class ChangeFeed:
    """The names of the nodes whose capacity changed since the reader last took them: added, removed,
    allocated on, released on, a GPU withdrawn or back. Labels, taints and cordon are not capacity
    (``Ledger.topology`` counts those). The ledger holds a feed weakly: a reader that goes away costs nothing."""

    __slots__ = ("__weakref__", "_names")

    def __init__(self) -> None:
        self._names: set[str] = set()

    def take(self) -> set[str]:
        """The names gathered since the last take (each once), and an empty feed."""
        names, self._names = self._names, set()
        return names

    def __len__(self) -> int:
        return len(self._names)


class Ledger:
    """Free capacity and allocations of one cluster; single-threaded (callers lock)."""

    def __init__(self) -> None:
        self.nodes: dict[str, Node] = {}
        self.gpus: dict[str, Gpu] = {}
        self.allocations: dict[str, Allocation] = {}
        self._gpu_index: dict[str, SortedList] = {}  # model -> GpuKey
        self._whole_index: dict[str, SortedList] = {}  # model -> (free whole, free milli, order, node)
        self._node_index: SortedList = SortedList()  # (free milli, order, name) for GPU-less requests
        self._expiry: SortedList = SortedList()  # (expires_at, claim)
        self._next_order = 0
        self.topology = 0  # bumped when a node joins, leaves, or changes labels, taints or cordon
        self._eligible: dict[NodeConstraints | None, frozenset[str] | None] = {}  # per topology: nodes allowed
        self._closed = 0  # nodes a request without constraints may not use (cordoned or tainted)
        self.free_gpu_milli = 0  # over every GPU in service: kept with the node index (O(1) to read)
        self._feeds: weakref.WeakSet[ChangeFeed] = weakref.WeakSet()

    def feed(self) -> ChangeFeed:
        """A new ``ChangeFeed``: every node whose capacity changes from now on is named in it."""
        feed = ChangeFeed()
        self._feeds.add(feed)
        return feed

    def _changed(self, name: str) -> None:
        for feed in self._feeds:
            feed._names.add(name)

    # ---- inventory -------------------------------------------------------------------------

    def add_node(
        self,
        name: str,
        gpus: Iterable[tuple[str, str, int]] = (),
        cpu_milli: int | None = None,
        memory_mib: int | None = None,
        order: int | None = None,
        labels: dict[str, str] | None = None,
        taints: tuple[Taint, ...] = (),
        unschedulable: bool = False,
        known: bool = True,
    ) -> Node:
        """Add a node with ``gpus`` as (uuid, model, memory MiB); each card is 1000 milli; ``labels``,
        ``taints`` and ``unschedulable`` as its Node object says (``set_facts`` changes them); ``known``
        False when nobody said (every pod may go there, as far as the queue knows)."""
        if not name:
            raise LedgerError("a node needs a name")
        if name in self.nodes:
            raise LedgerError(f"node {name} is already in the ledger")
        cards = list(gpus)
        uuids = [u for u, _, _ in cards]
        if len(set(uuids)) != len(uuids) or any(not u for u in uuids):
            raise LedgerError(f"node {name}: GPU uuids must be unique and non-empty")
        taken = [u for u in uuids if u in self.gpus]
        if taken:
            raise LedgerError(f"node {name}: GPU {taken[0]} already belongs to node {self.gpus[taken[0]].node}")
        if any(mib < 0 for _, _, mib in cards) or (cpu_milli or 0) < 0 or (memory_mib or 0) < 0:
            raise LedgerError(f"node {name}: capacities must not be negative")
        if order is None:
            order = self._next_order
        self._next_order = max(self._next_order, order + 1)
        node = Node(name, order, [], cpu_milli, memory_mib, cpu_milli or 0, memory_mib or 0)
        self._set_facts(node, dict(labels or {}), tuple(taints), bool(unschedulable), known)
        for i, (uuid, model, mib) in enumerate(cards):
            node.gpus.append(Gpu(uuid, name, i, model, MILLI_PER_GPU, mib, MILLI_PER_GPU, mib))
        self.nodes[name] = node
        for g in node.gpus:
            self.gpus[g.uuid] = g
        self._index_node(node)
        self._closed += not node.facts.open
        self._topology_changed()
        return node

    def set_facts(self, name: str, labels: dict[str, str], taints: tuple[Taint, ...] = (),
                  unschedulable: bool = False, known: bool = True) -> bool:
        """Make ``name``'s labels, taints and cordon these; True when something changed. What it holds
        stays: constraints decide new placements only."""
        node = self._node(name)
        if not all(isinstance(t, Taint) for t in taints):
            raise LedgerError(f"node {name}: taints must be packing.node_fit.Taint")
        old = node.facts
        self._set_facts(node, dict(labels), tuple(taints), bool(unschedulable), known)
        if node.facts == old:
            return False
        self._closed += int(not node.facts.open) - int(not old.open)
        self._topology_changed()
        return True

    @staticmethod
    def _set_facts(node: Node, labels: dict[str, str], taints: tuple[Taint, ...], unschedulable: bool,
                   known: bool) -> None:
        node.labels = labels
        node.facts = NodeFacts(tuple(sorted(labels.items())), taints, unschedulable, known)
        node.allowed.clear()

    def _topology_changed(self) -> None:
        self.topology += 1
        self._eligible.clear()

    def eligible(self, request: Request) -> frozenset[str] | None:
        """The nodes ``request``'s pod may use by its constraints; None when that is every node (the
        common case, O(1)). Cached per constraints until the topology changes: O(nodes) per miss."""
        c = request.constraints
        if c is None and self._closed == 0:
            return None
        if c not in self._eligible:
            found = frozenset(n.name for n in self.nodes.values() if n.allows(request))
            self._eligible[c] = None if len(found) == len(self.nodes) else found  # every node: the fast path
        return self._eligible[c]

    def remove_node(self, name: str) -> list[Allocation]:
        """Drop a node and every allocation on it; returns the dropped allocations."""
        node = self._node(name)
        dropped = [a for a in self.allocations.values() if a.node == name]
        for a in dropped:
            self._unapply(a)
        self._unindex_node(node)
        for g in node.gpus:
            del self.gpus[g.uuid]
        del self.nodes[name]
        self._changed(name)
        self._closed -= not node.facts.open
        self._topology_changed()
        return dropped

    def _node(self, name: str) -> Node:
        try:
            return self.nodes[name]
        except KeyError:
            raise LedgerError(f"node {name} is not in the ledger") from None

    # ---- indexes ---------------------------------------------------------------------------

    @staticmethod
    def _gpu_key(g: Gpu, node: Node, node_free: int) -> GpuKey:
        return (g.free_milli, node_free, node.order, g.index, g.uuid)

    def _index_node(self, node: Node) -> None:
        free = node.free_gpu_milli
        whole_by_model: dict[str, int] = {}
        for g in node.gpus:
            if g.withdrawn:
                continue
            index = self._gpu_index.get(g.model)
            if index is None:  # not setdefault(model, SortedList()): that builds a list per call
                index = self._gpu_index[g.model] = SortedList()
            index.add(self._gpu_key(g, node, free))
            whole_by_model.setdefault(g.model, 0)
            if g.empty:
                whole_by_model[g.model] += 1
        for model, whole in whole_by_model.items():
            whole_index = self._whole_index.get(model)
            if whole_index is None:
                whole_index = self._whole_index[model] = SortedList()
            whole_index.add((whole, free, node.order, node.name))
        self._node_index.add((free, node.order, node.name))
        self.free_gpu_milli += free
        if self._feeds:
            self._changed(node.name)  # every change of a node's capacity re-indexes it: one place to tell

    def _unindex_node(self, node: Node) -> None:
        free = node.free_gpu_milli
        whole_by_model: dict[str, int] = {}
        for g in node.gpus:
            if g.withdrawn:
                continue
            self._gpu_index[g.model].remove(self._gpu_key(g, node, free))
            whole_by_model.setdefault(g.model, 0)
            if g.empty:
                whole_by_model[g.model] += 1
        for model, whole in whole_by_model.items():
            self._whole_index[model].remove((whole, free, node.order, node.name))
        self._node_index.remove((free, node.order, node.name))
        self.free_gpu_milli -= free

    # ---- queries used by the policies -----------------------------------------------------

    def models(self) -> list[str]:
        return sorted(self._gpu_index)

    def gpus_from(self, model: str, min_free_milli: int) -> Iterator[Gpu]:
        """GPUs of ``model`` with at least ``min_free_milli`` free, tightest first (best fit)."""
        index = self._gpu_index.get(model)
        if index is None:
            return
        for key in index.irange((min_free_milli,)):
            yield self.gpus[key[4]]

    def gpus_from_largest(self, model: str, min_free_milli: int) -> Iterator[Gpu]:
        """GPUs of ``model`` with at least ``min_free_milli`` free, loosest first (worst fit)."""
        index = self._gpu_index.get(model)
        if index is None:
            return
        for key in index.irange((min_free_milli,), reverse=True):
            yield self.gpus[key[4]]

    def nodes_with_whole(self, model: str, count: int) -> Iterator[Node]:
        """Nodes with at least ``count`` empty cards of ``model``, fewest empty cards first."""
        index = self._whole_index.get(model)
        if index is None:
            return
        for key in index.irange((count,)):
            yield self.nodes[key[3]]

    def nodes_by_free_gpu(self) -> Iterator[Node]:
        """All nodes, the least idle GPU capacity first (for GPU-less requests)."""
        for key in self._node_index:
            yield self.nodes[key[2]]

    def host_fits(self, node: Node, request: Request) -> bool:
        if node.cpu_milli is not None and request.cpu_milli > node.free_cpu:
            return False
        return node.memory_mib is None or request.host_memory_mib <= node.free_mem

    @staticmethod
    def gpu_fits(g: Gpu, request: Request) -> bool:
        return (
            g.free_milli >= request.milli
            and g.free_mib >= request.memory_mib
            and request.accepts_model(g.model)
        )

    def fitting_gpus(self, node: Node, request: Request) -> list[Gpu]:
        """GPUs of ``node`` that could take one share of ``request`` (whole: empty cards; never withdrawn)."""
        if request.whole:
            return [g for g in node.gpus if g.empty and not g.withdrawn and request.accepts_model(g.model)
                    and g.memory_mib >= request.memory_mib]
        return [g for g in node.gpus if not g.withdrawn and self.gpu_fits(g, request)]

    def fits_on(self, node: Node, request: Request) -> bool:
        if not self.host_fits(node, request):
            return False
        if request.gpu_less:
            return True
        return len(self.fitting_gpus(node, request)) >= request.count

    def explain(self, request: Request, node_name: str) -> Misfit | None:
        """Why ``request`` does not fit on ``node_name`` now, or None when it fits."""
        node = self.nodes.get(node_name)
        if node is None:
            return Misfit("UnknownNode", f"gpuslice knows no GPUs on node {node_name}", False)
        if node.cpu_milli is not None and request.cpu_milli > node.free_cpu:
            resolvable = request.cpu_milli <= node.cpu_milli
            return Misfit("InsufficientCPU", f"needs {request.cpu_milli}m CPU; {node.free_cpu}m free", resolvable)
        if node.memory_mib is not None and request.host_memory_mib > node.free_mem:
            resolvable = request.host_memory_mib <= node.memory_mib
            return Misfit("InsufficientMemory",
                          f"needs {request.host_memory_mib} MiB RAM; {node.free_mem} MiB free", resolvable)
        if request.gpu_less:
            return None
        models = [g for g in node.gpus if request.accepts_model(g.model)]
        if not models:
            have = sorted({g.model for g in node.gpus}) or ["no GPUs"]
            want = request.model or "any"
            return Misfit("NoMatchingGPU", f"no {want} GPU on this node (has {', '.join(have)})", False)
        big = [g for g in models if g.memory_mib >= request.memory_mib and g.milli >= request.milli]
        if len(big) < request.count:
            return Misfit("TooLarge", f"{request.describe()} is larger than this node's cards", False)
        active = [g for g in models if not g.withdrawn]
        if sum(1 for g in big if not g.withdrawn) < request.count:
            gone = len(models) - len(active)
            return Misfit("Withdrawn", f"{gone} of this node's GPUs are withdrawn (gone or unhealthy)", False)
        fitting = self.fitting_gpus(node, request)
        if len(fitting) >= request.count:
            return None
        if request.whole:
            return Misfit("NotEnoughWholeGPUs",
                          f"needs {request.count} empty card(s); {len(fitting)} empty here", True)
        largest = max(active, key=lambda g: (g.free_milli, g.free_mib))
        if largest.free_milli >= request.milli:
            return Misfit("NoGPUMemoryFree",
                          f"needs {request.memory_mib} MiB on one GPU; largest free {largest.free_mib} MiB", True)
        return Misfit("NoSliceFree",
                      f"no GPU with {request.milli} milli free; largest free {largest.free_milli}", True)

    # ---- mutations ---------------------------------------------------------------------------

    def _apply(self, alloc: Allocation) -> None:
        """Take ``alloc``'s shares off its node; caller has checked they fit."""
        node = self.nodes[alloc.node]
        self._unindex_node(node)
        for s in alloc.shares:
            g = self.gpus[s.uuid]
            g.free_milli -= s.milli
            g.free_mib -= s.memory_mib
        if node.cpu_milli is not None:
            node.free_cpu -= alloc.request.cpu_milli
        if node.memory_mib is not None:
            node.free_mem -= alloc.request.host_memory_mib
        self._index_node(node)
        self.allocations[alloc.claim] = alloc
        if alloc.expires_at is not None:
            self._expiry.add((alloc.expires_at, alloc.claim))

    def _unapply(self, alloc: Allocation) -> None:
        node = self.nodes[alloc.node]
        self._unindex_node(node)
        for s in alloc.shares:
            g = self.gpus[s.uuid]
            g.free_milli += s.milli
            g.free_mib += s.memory_mib
        if node.cpu_milli is not None:
            node.free_cpu += alloc.request.cpu_milli
        if node.memory_mib is not None:
            node.free_mem += alloc.request.host_memory_mib
        self._index_node(node)
        del self.allocations[alloc.claim]
        if alloc.expires_at is not None:
            self._expiry.remove((alloc.expires_at, alloc.claim))

    def assign(
        self, claim: str, request: Request, node: str, gpus: tuple[str, ...], expires_at: float | None = None
    ) -> Allocation:
        """Put ``claim`` on exactly ``gpus`` of ``node`` (a decided placement, or a record read back)."""
        if not claim:
            raise LedgerError("a claim needs a uid")
        if claim in self.allocations:
            raise LedgerError(f"claim {claim} already holds an allocation on {self.allocations[claim].node}")
        n = self._node(node)
        if len(gpus) != request.count or len(set(gpus)) != len(gpus):
            raise LedgerError(f"claim {claim}: {request.describe()} needs {request.count} distinct GPU(s)")
        if not self.host_fits(n, request):
            raise NoFit(f"claim {claim}: node {node} lacks CPU or memory for it")
        for uuid in gpus:
            g = self.gpus.get(uuid)
            if g is None or g.node != node:
                raise LedgerError(f"claim {claim}: GPU {uuid} is not on node {node}")
            if g.withdrawn:
                raise NoFit(f"claim {claim}: GPU {uuid} is withdrawn: it takes no new placement")
            if not self.gpu_fits(g, request) or (request.whole and not g.empty):
                raise NoFit(f"claim {claim}: GPU {uuid} has {g.free_milli} milli / {g.free_mib} MiB free, "
                            f"needs {request.milli} / {request.memory_mib}")
        shares = tuple(GpuShare(u, request.milli, request.memory_mib) for u in gpus)
        alloc = Allocation(claim, node, shares, request, expires_at)
        self._apply(alloc)
        return alloc

    def readmit(self, alloc: Allocation) -> Allocation:
        """Put a released allocation back exactly as it was (undoing ``release``), withdrawn GPUs included:
        it held them before they were withdrawn."""
        held = self.allocations.get(alloc.claim)
        if held is not None:
            raise LedgerError(f"claim {alloc.claim} already holds an allocation on {held.node}")
        node = self._node(alloc.node)
        if not self.host_fits(node, alloc.request):
            raise NoFit(f"claim {alloc.claim}: node {alloc.node} lacks CPU or memory for it")
        for s in alloc.shares:
            g = self.gpus.get(s.uuid)
            if g is None or g.node != alloc.node:
                raise LedgerError(f"claim {alloc.claim}: GPU {s.uuid} is not on node {alloc.node}")
            if g.free_milli < s.milli or g.free_mib < s.memory_mib:
                raise NoFit(f"claim {alloc.claim}: GPU {s.uuid} has {g.free_milli} milli / {g.free_mib} MiB free")
        self._apply(alloc)
        return alloc

    def withdraw(self, uuid: str, withdrawn: bool = True) -> None:
        """Take a GPU out of (or, with ``withdrawn=False``, back into) new placements; its allocations stay."""
        g = self.gpus.get(uuid)
        if g is None:
            raise LedgerError(f"GPU {uuid} is not in the ledger")
        if g.withdrawn == withdrawn:
            return
        node = self.nodes[g.node]
        self._unindex_node(node)
        g.withdrawn = withdrawn
        self._index_node(node)

    def release(self, claim: str) -> Allocation:
        """Give back ``claim``'s capacity (committed or reserved); returns what it held."""
        alloc = self.allocations.get(claim)
        if alloc is None:
            raise UnknownClaim(f"claim {claim} holds no allocation")
        self._unapply(alloc)
        return alloc

    def commit(self, claim: str) -> Allocation:
        """Turn a reservation into a lasting allocation (idempotent for committed claims)."""
        alloc = self.allocations.get(claim)
        if alloc is None:
            raise UnknownClaim(f"claim {claim} holds no allocation")
        if alloc.expires_at is None:
            return alloc
        self._expiry.remove((alloc.expires_at, claim))
        committed = Allocation(alloc.claim, alloc.node, alloc.shares, alloc.request, None)
        self.allocations[claim] = committed
        return committed

    def extend(self, claim: str, expires_at: float) -> Allocation:
        """Move a reservation's deadline; LedgerError for a committed claim."""
        alloc = self.allocations.get(claim)
        if alloc is None:
            raise UnknownClaim(f"claim {claim} holds no allocation")
        if alloc.expires_at is None:
            raise LedgerError(f"claim {claim} is committed, not reserved")
        self._expiry.remove((alloc.expires_at, claim))
        renewed = Allocation(alloc.claim, alloc.node, alloc.shares, alloc.request, expires_at)
        self.allocations[claim] = renewed
        self._expiry.add((expires_at, claim))
        return renewed

    def expire(self, now: float) -> list[Allocation]:
        """Cancel every reservation whose deadline is at or before ``now``."""
        expired: list[Allocation] = []
        while self._expiry and self._expiry[0][0] <= now:
            _, claim = self._expiry[0]
            expired.append(self.release(claim))
        return expired

    # ---- accounting ---------------------------------------------------------------------------

    def capacity_milli(self, model: str | None = None) -> int:
        return sum(g.milli for g in self.gpus.values() if model is None or g.model == model)

    def free_milli(self, model: str | None = None) -> int:
        return sum(g.free_milli for g in self.gpus.values() if model is None or g.model == model)

    def free_slices(self, request: Request) -> int:
        """How many more shares of ``request`` the ledger could hold right now (GPU-wise)."""
        if request.gpu_less:
            return 0
        if request.whole:
            return sum(len(self.fitting_gpus(n, request)) // request.count for n in self.nodes.values())
        total = 0
        for g in self.gpus.values():
            if request.accepts_model(g.model) and not g.withdrawn:
                by_milli = g.free_milli // request.milli
                by_mib = g.free_mib // request.memory_mib if request.memory_mib else by_milli
                total += min(by_milli, by_mib)
        return total

    def verify(self) -> None:
        """Recompute everything from the allocations; AssertionError names the first mismatch."""
        used: dict[str, list[int]] = {u: [0, 0] for u in self.gpus}
        host: dict[str, list[int]] = {n: [0, 0] for n in self.nodes}
        for a in self.allocations.values():
            assert a.node in self.nodes, f"{a.claim} on unknown node {a.node}"
            host[a.node][0] += a.request.cpu_milli
            host[a.node][1] += a.request.host_memory_mib
            for s in a.shares:
                assert self.gpus[s.uuid].node == a.node, f"{a.claim}: GPU {s.uuid} not on {a.node}"
                used[s.uuid][0] += s.milli
                used[s.uuid][1] += s.memory_mib
        for uuid, g in self.gpus.items():
            assert 0 <= g.free_milli <= g.milli, f"GPU {uuid} over-committed: free {g.free_milli}"
            assert 0 <= g.free_mib <= g.memory_mib, f"GPU {uuid} memory over-committed: free {g.free_mib}"
            assert g.free_milli + used[uuid][0] == g.milli, f"GPU {uuid}: milli not accounted once"
            assert g.free_mib + used[uuid][1] == g.memory_mib, f"GPU {uuid}: MiB not accounted once"
        for name, n in self.nodes.items():
            if n.cpu_milli is not None:
                assert n.free_cpu + host[name][0] == n.cpu_milli and n.free_cpu >= 0, f"{name}: CPU"
            if n.memory_mib is not None:
                assert n.free_mem + host[name][1] == n.memory_mib and n.free_mem >= 0, f"{name}: RAM"
        fresh = Ledger()
        for n in sorted(self.nodes.values(), key=lambda n: n.order):
            fresh._index_node(n)
        assert list(fresh._node_index) == list(self._node_index), "node index drifted"
        for model in set(fresh._gpu_index) | set(self._gpu_index):
            assert list(fresh._gpu_index.get(model, [])) == list(self._gpu_index.get(model, [])), \
                f"GPU index drifted for {model}"
        for model in set(fresh._whole_index) | set(self._whole_index):
            assert list(fresh._whole_index.get(model, [])) == list(self._whole_index.get(model, [])), \
                f"whole-card index drifted for {model}"
        reserved = sorted((a.expires_at, a.claim) for a in self.allocations.values() if a.expires_at is not None)
        assert reserved == list(self._expiry), "expiry index drifted"
        assert self._closed == sum(not n.facts.open for n in self.nodes.values()), "closed-node count drifted"
        assert self.free_gpu_milli == sum(n.free_gpu_milli for n in self.nodes.values()), "free GPU total drifted"
        for n in self.nodes.values():
            assert n.facts.labels == tuple(sorted(n.labels.items())), f"{n.name}: labels drifted from its facts"
            for c, hit in n.allowed.items():
                assert hit == may_run(c, n.name, n.facts), f"{n.name}: stale node-constraint memo"

    def fingerprint(self) -> tuple[object, ...]:
        """A value equal for equal ledgers (free capacity, allocations, indexes)."""
        return (
            tuple((u, g.free_milli, g.free_mib, g.withdrawn) for u, g in sorted(self.gpus.items())),
            tuple((n, x.free_cpu, x.free_mem, x.facts) for n, x in sorted(self.nodes.items())),
            tuple(sorted(self.allocations.items())),
            tuple((m, tuple(ix)) for m, ix in sorted(self._gpu_index.items())),
            tuple((m, tuple(ix)) for m, ix in sorted(self._whole_index.items())),
            tuple(self._node_index),
            tuple(self._expiry),
        )
