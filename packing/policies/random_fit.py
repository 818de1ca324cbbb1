"""``random`` (baseline): a uniformly random node among those that fit; inside it, a random fitting card.

The FGD study's Random (``random_score.go`` with ``allocateGpuIdBasedOnRandomFit``). Its key is a
fresh random number, so it declares ``sampled``: ``best_nodes`` is one draw among the fitting
nodes (rejection sampling, then a full list), and no key may be cached. Randomness comes from
the policy's context (``policy_for(..., seed=...)``).
"""

from __future__ import annotations

from collections.abc import Collection

from packing.ledger import Ledger, Node
from packing.policies.base import Capabilities, NodeKey, Policy, PolicyContext
from packing.products import Request

REJECTION_TRIES = 32  # random draws before falling back to listing every fitting node


def _key(ctx: PolicyContext, ledger: Ledger, request: Request, node: Node) -> NodeKey | None:
    return (ctx.random().random(),) if ledger.fits_on(node, request) else None


def _pick(ctx: PolicyContext, ledger: Ledger, request: Request, node: Node) -> tuple[str, ...] | None:
    if not ledger.fits_on(node, request):
        return None
    if request.gpu_less:
        return ()
    gpus = ledger.fitting_gpus(node, request)
    if request.whole:
        return tuple(g.uuid for g in sorted(gpus, key=lambda g: g.index)[: request.count])
    return (ctx.random().choice(gpus).uuid,)


def _sample(ctx: PolicyContext, ledger: Ledger, request: Request, nodes: Collection[str] | None,
            _first_only: bool) -> list[str]:
    rng = ctx.random()
    names = list(ledger.nodes if nodes is None else nodes)
    if not names:
        return []
    for _ in range(REJECTION_TRIES):
        node = ledger.nodes.get(rng.choice(names))
        if node is not None and ledger.fits_on(node, request):
            return [node.name]
    fitting = [n for n in names if n in ledger.nodes and ledger.fits_on(ledger.nodes[n], request)]
    return [rng.choice(fitting)] if fitting else []


RANDOM_FIT = Policy("random", "FGD baseline: a random node that fits, a random GPU that fits",
                    _key, _pick, Capabilities(node_local=False, sampled=True, baseline=True), fast_best=_sample)
