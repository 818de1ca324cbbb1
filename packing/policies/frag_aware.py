"""``frag-aware``: best fit that never breaks an empty card for a slice while a partly used card fits.

Key for a slice: ``(0, tightest leftover among partly used fitting cards, node's free milli)``
when the node has such a card, else ``(1, best fit's key)``; whole cards and GPU-less requests
keep best fit's key. The pick prefers a partly used card, then the tightest.
"""

from __future__ import annotations

from packing.ledger import Ledger, Node
from packing.policies.base import (
    Capabilities,
    NodeKey,
    Policy,
    PolicyContext,
    gpu_candidates,
    pick_with,
    tightest,
)
from packing.policies.best_fit import best_fit_key
from packing.products import Request


def _key(_ctx: PolicyContext, ledger: Ledger, request: Request, node: Node) -> NodeKey | None:
    key = best_fit_key(ledger, request, node)
    if key is None or request.whole or request.gpu_less:
        return key
    partly = [g for g in gpu_candidates(ledger, node, request) if not g.empty]
    if partly:
        return (0, min(g.free_milli - request.milli for g in partly), node.free_gpu_milli)
    return (1, key[0], key[1])


_tightest_pick = pick_with(tightest)


def _pick(ctx: PolicyContext, ledger: Ledger, request: Request, node: Node) -> tuple[str, ...] | None:
    if request.gpu_less or request.whole:
        return _tightest_pick(ctx, ledger, request, node)
    gpus = gpu_candidates(ledger, node, request)
    if not gpus:
        return None
    gpus.sort(key=lambda g: (g.empty, *tightest(g, request)))
    return (gpus[0].uuid,)


FRAG_AWARE = Policy(
    "frag-aware",
    "best fit, but never break an empty card for a slice while a partly used card fits",
    _key,
    _pick,
    Capabilities(),
)
