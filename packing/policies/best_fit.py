"""``best-fit``: GPU-level best fit, the smallest leftover on the chosen card, then the fullest node.

Key (lower is better), for a request of ``milli`` per card on a node whose host has room:

* a slice: ``(min over fitting cards of (free − milli), node's free GPU milli)``;
* k whole cards: ``(empty cards of the node, node's free GPU milli)`` (the fewest that still hold k);
* no GPU: ``(0, node's free GPU milli)`` (the node with the least idle GPU keeps the others' CPU).

The pick is the tightest card(s) inside the node. For strongly divisible sizes (1/4, 1/2, 1 of a
card) online best fit packs optimally before departures (Coffman, Garey & Johnson 1987).

Fast path: the ledger keeps every card in a sorted index of (free milli, node's free milli, node
order, card), so the best node is an O(log n) look-up plus the skipped entries, not a scan.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator

from packing.ledger import Ledger, Node
from packing.policies.base import (
    Capabilities,
    NodeKey,
    Policy,
    PolicyContext,
    gpu_candidates,
    host_ok,
    pick_with,
    tightest,
)
from packing.products import Request


def best_fit_key(ledger: Ledger, request: Request, node: Node) -> NodeKey | None:
    """Best fit's key of ``node`` for ``request`` (see the module docstring), None when it does not fit."""
    if request.gpu_less:
        return (0, node.free_gpu_milli) if host_ok(ledger, node, request) else None
    gpus = gpu_candidates(ledger, node, request)
    if len(gpus) < request.count:
        return None
    if request.whole:
        return (len(gpus), node.free_gpu_milli)  # fewest empty cards that still hold k
    return (min(g.free_milli - request.milli for g in gpus), node.free_gpu_milli)


def _key(_ctx: PolicyContext, ledger: Ledger, request: Request, node: Node) -> NodeKey | None:
    return best_fit_key(ledger, request, node)


def _index_candidates(
    ledger: Ledger, request: Request, model: str, allowed: Collection[str] | None
) -> Iterator[tuple[Node, NodeKey]]:
    """(node, best-fit key) for ``model`` in the ledger index's order: ascending key, then node order."""
    if request.whole:
        for n in ledger.nodes_with_whole(model, request.count):
            if allowed is None or n.name in allowed:
                key = best_fit_key(ledger, request, n)
                if key is not None:
                    yield n, key
        return
    for g in ledger.gpus_from(model, request.milli):
        node = ledger.nodes[g.node]
        if allowed is not None and node.name not in allowed:
            continue
        if ledger.gpu_fits(g, request) and ledger.host_fits(node, request):
            yield node, (g.free_milli - request.milli, node.free_gpu_milli)


def indexed_best_nodes(
    ledger: Ledger, request: Request, nodes: Collection[str] | None, first_only: bool = False
) -> list[str] | None:
    """Best fit's nodes through the sorted index: O(log n + skipped entries + ties).

    ``first_only`` stops at the best (key, node order), which is all ``choose`` needs: a cluster
    of identical nodes then costs a look-up, not a walk over every tying node.
    Returns None when the fast path does not apply (GPU-less requests), so the caller scans.
    """
    models = [m for m in ledger.models() if request.accepts_model(m)]
    if request.gpu_less or (request.whole and len(models) > 1):
        return None  # k empty cards may span models on one node: the per-model whole index cannot rank that
    allowed = None if nodes is None else (nodes if isinstance(nodes, (set, frozenset, dict)) else set(nodes))
    bound: tuple[NodeKey, int] | None = None  # the best (key, node order) met so far
    found: dict[str, tuple[NodeKey, int]] = {}
    for model in models:
        for node, key in _index_candidates(ledger, request, model, allowed):
            rank = (key, node.order)
            if bound is not None and (key > bound[0] or (first_only and rank > bound)):
                break  # ascending index: nothing better follows in this model
            bound = rank if bound is None or rank < bound else bound
            if node.name not in found or rank < found[node.name]:
                found[node.name] = rank  # a node's key is its best card over every model's index
    if bound is None:
        return []
    best = [n for n, r in found.items() if r[0] == bound[0] and (r == bound or not first_only)]
    return sorted(best, key=lambda n: (ledger.nodes[n].order, n))


def _fast(_ctx: PolicyContext, ledger: Ledger, request: Request, nodes: Collection[str] | None,
          first_only: bool) -> list[str] | None:
    return indexed_best_nodes(ledger, request, nodes, first_only)


BEST_FIT = Policy(
    "best-fit",
    "the GPU whose leftover is smallest, then the fullest node, then a stable order",
    _key,
    pick_with(tightest),
    Capabilities(indexed=True),
    fast_best=_fast,
)
