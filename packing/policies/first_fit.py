"""``first-fit``: the first node in stable order that fits, its first card that fits.

Key: ``(0,)`` on every node where the request fits, so the node order decides; the pick is the
lowest-index fitting card(s). Optimal before departures for strongly divisible sizes, like best
fit, but it spreads load over partly used cards once departures free them.
"""

from __future__ import annotations

from packing.ledger import Ledger, Node
from packing.policies.base import Capabilities, NodeKey, Policy, PolicyContext, first_card, pick_with
from packing.policies.best_fit import best_fit_key
from packing.products import Request


def _key(_ctx: PolicyContext, ledger: Ledger, request: Request, node: Node) -> NodeKey | None:
    return (0,) if best_fit_key(ledger, request, node) is not None else None


FIRST_FIT = Policy("first-fit", "the first node in stable order that fits, its first GPU that fits",
                   _key, pick_with(first_card), Capabilities())
