"""Estimated start: the earliest time a request is sure to fit, from running claims' declared ends.

A running claim that declared an enforced time limit (``activeDeadlineSeconds`` or our annotation)
ends by a known time; one that declared none may run forever. The estimate releases the declared
claims in order of their end, on a scratch copy of the touched GPUs and nodes, and returns the
first end after which the request fits on some node. Claims without a declared end are assumed
never to end, so the estimate is an upper bound on when the request can start, provided nothing
else takes the capacity meanwhile (the aging guard makes sure of that for the head of the line);
None when the declared claims alone never free enough.

Cost: O(L log L) for L running claims with a declared end, plus the GPUs of the touched nodes;
the live ledger is only read.

``RuntimeHistory`` estimates, for claims that declare no limit, how likely they are to end soon,
from the runtimes of the claims of their product that ended.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Iterable

from sortedcontainers import SortedList

from packing.ledger import Gpu, Ledger, Node
from packing.products import Request


class _Models(dict[str, bool]):
    """Memo of ``request.accepts_model`` per GPU model label (fnmatch is the hot spot otherwise)."""

    def __init__(self, request: Request) -> None:
        super().__init__()
        self.request = request

    def __missing__(self, model: str) -> bool:
        self[model] = ok = self.request.accepts_model(model)
        return ok


def _gpu_takes(g: Gpu, request: Request, gpu_free: dict[str, list[int]], models: _Models) -> bool:
    if not models[g.model]:
        return False
    free_milli, free_mib = gpu_free.get(g.uuid, (g.free_milli, g.free_mib))
    if request.whole:
        return free_milli == g.milli and free_mib == g.memory_mib and g.memory_mib >= request.memory_mib
    return free_milli >= request.milli and free_mib >= request.memory_mib


def fits_in(node: Node, request: Request, gpu_free: dict[str, list[int]], host_free: list[int] | None,
            models: _Models | None = None) -> bool:
    """Does ``request`` fit on ``node`` given scratch free capacities (live values where absent)?"""
    cpu, mem = host_free if host_free is not None else (node.free_cpu, node.free_mem)
    if node.cpu_milli is not None and request.cpu_milli > cpu:
        return False
    if node.memory_mib is not None and request.host_memory_mib > mem:
        return False
    if request.gpu_less:
        return True
    models = models if models is not None else _Models(request)
    found = 0
    for g in node.gpus:
        found += _gpu_takes(g, request, gpu_free, models)
        if found >= request.count:
            return True
    return False


def estimated_start(ledger: Ledger, request: Request, ends: Iterable[tuple[float, str]], now: float,
                    nodes: Collection[str] | None = None) -> float | None:
    """First declared end (not before ``now``) after which ``request`` fits; None if none does.

    ``ends`` lists (declared end, claim) of running claims, ascending; claims no longer holding an
    allocation in the ledger are skipped. ``now`` when the request fits already. With ``nodes``,
    only a fit on one of those nodes counts (the aging guard's drain target).
    """
    found = earliest_node(ledger, request, ends, now, nodes)
    return None if found is None else found[0]


def earliest_node(ledger: Ledger, request: Request, ends: Iterable[tuple[float, str]], now: float,
                  nodes: Collection[str] | None = None, exclude: Collection[str] = ()) -> tuple[float, str] | None:
    """(estimated start, node): the first node ``request``'s pod may use, among ``nodes`` (all when
    None) less ``exclude``, where ``request`` fits after the declared ends in ``ends``, and when; None
    when the declared claims never free enough there. A node where it fits already comes first, at
    ``now``."""
    def allowed(name: str) -> bool:
        wanted = (nodes is None or name in nodes) and name not in exclude
        return wanted and ledger.nodes[name].allows(request)

    for n in _candidate_nodes(ledger, request):
        if allowed(n.name) and fits_in(n, request, {}, None):
            return now, n.name
    gpu_free: dict[str, list[int]] = {}
    host_free: dict[str, list[int]] = {}
    models = _Models(request)
    for end, claim in ends:
        alloc = ledger.allocations.get(claim)
        if alloc is None:
            continue
        node = ledger.nodes[alloc.node]
        for share in alloc.shares:
            g = ledger.gpus[share.uuid]
            free = gpu_free.setdefault(share.uuid, [g.free_milli, g.free_mib])
            free[0] += share.milli
            free[1] += share.memory_mib
        host = host_free.setdefault(node.name, [node.free_cpu, node.free_mem])
        host[0] += alloc.request.cpu_milli
        host[1] += alloc.request.host_memory_mib
        if not allowed(node.name):
            continue
        if request.count == 1 and node.cpu_milli is None and node.memory_mib is None and not request.gpu_less:
            # nothing fitted before this release: only the GPUs it freed can take a one-GPU request now
            fits = any(_gpu_takes(ledger.gpus[s.uuid], request, gpu_free, models) for s in alloc.shares)
        else:
            fits = fits_in(node, request, gpu_free, host, models)
        if fits:
            return max(end, now), node.name
    return None


def _candidate_nodes(ledger: Ledger, request: Request) -> Iterable[Node]:
    """Nodes worth checking for a fit now: through the free-capacity index when it applies."""
    if request.gpu_less:
        return ledger.nodes.values()
    seen: dict[str, Node] = {}
    for model in ledger.models():
        if not request.accepts_model(model):
            continue
        if request.whole:
            for n in ledger.nodes_with_whole(model, request.count):
                seen.setdefault(n.name, n)
        else:
            for g in ledger.gpus_from(model, request.milli):
                seen.setdefault(g.node, ledger.nodes[g.node])
    return seen.values()


class RuntimeHistory:
    """How long the claims that ended ran, per product: the last ``window`` runtimes of each.

    It answers how likely a running claim of a given age is to end within a horizon, for claims that
    declare no limit: from the product's runtimes seen, P(R <= age + h | R > age), counting one
    unseen longer run (so a claim older than everything seen gets 0, not a division by zero). With
    fewer than ``min_seen`` runtimes of a product it falls back on the heavy-tail prior
    h / (age + h) (a Pareto tail of index 1: the longer a claim has run, the longer it will run),
    which prefers the youngest claims, as the traces' runtimes do. Cost: O(log window) per call.
    """

    def __init__(self, window: int = 2000, min_seen: int = 20) -> None:
        self.window = window
        self.min_seen = min_seen
        self._sorted: dict[str, SortedList] = {}
        self._recent: dict[str, deque[float]] = {}

    def add(self, product: str, runtime: float) -> None:
        """Record a claim of ``product`` that ran ``runtime`` seconds."""
        ordered = self._sorted.get(product)
        if ordered is None:
            ordered = self._sorted[product] = SortedList()
            self._recent[product] = deque()
        recent = self._recent[product]
        ordered.add(runtime)
        recent.append(runtime)
        if len(recent) > self.window:
            ordered.remove(recent.popleft())

    def seen(self, product: str) -> int:
        """How many runtimes of ``product`` the history holds."""
        return len(self._recent.get(product, ()))

    def ends_within(self, product: str, age: float, horizon: float) -> float:
        """The chance that a claim of ``product`` that has run ``age`` seconds ends within ``horizon``."""
        age = max(0.0, age)
        ordered = self._sorted.get(product)
        if ordered is None or len(ordered) < self.min_seen:
            return horizon / (age + horizon) if horizon > 0 else 0.0
        longer: int = len(ordered) - ordered.bisect_right(age)
        beyond: int = len(ordered) - ordered.bisect_right(age + horizon)
        return (longer - beyond) / (longer + 1)
