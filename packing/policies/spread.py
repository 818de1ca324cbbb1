"""``spread``: worst fit, the largest leftover on the chosen card, then the emptiest node.

Key: a slice ``(−(largest fitting free − milli), −node's free GPU milli)``; k whole cards
``(−empty cards, −node's free GPU milli)``; no GPU ``(0, −node's free GPU milli)``. The pick is
the loosest card(s). It balances load and fragments most: a reference point, not a default.
"""

from __future__ import annotations

from packing.ledger import Ledger, Node
from packing.policies.base import Capabilities, NodeKey, Policy, PolicyContext, gpu_candidates, loosest, pick_with
from packing.policies.best_fit import best_fit_key
from packing.products import Request


def _key(_ctx: PolicyContext, ledger: Ledger, request: Request, node: Node) -> NodeKey | None:
    key = best_fit_key(ledger, request, node)
    if key is None:
        return None
    if request.whole or request.gpu_less:
        return (-key[0], -key[1])
    largest = max(g.free_milli for g in gpu_candidates(ledger, node, request))
    return (-(largest - request.milli), -node.free_gpu_milli)


SPREAD = Policy("spread", "worst fit: the GPU with the largest leftover, then the emptiest node",
                _key, pick_with(loosest), Capabilities())
