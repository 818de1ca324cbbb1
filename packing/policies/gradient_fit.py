"""``gradient-fit``: placeholder, being measured."""

from __future__ import annotations

from packing.ledger import Ledger, Node
from packing.policies.base import Capabilities, NodeKey, Policy, PolicyContext
from packing.policies.fgd import best_placement, fgd_score, placements
from packing.products import Request


def _key(ctx: PolicyContext, ledger: Ledger, request: Request, node: Node) -> NodeKey | None:
    options = placements(ctx.mix(), ledger, request, node)
    if not options:
        return None
    level = fgd_score(best_placement(options)[0])
    if request.gpu_less:
        return (node.free_gpu_milli, -level, node.order)
    return (-level, all(g.empty for g in node.gpus), node.order)


def _pick(ctx: PolicyContext, ledger: Ledger, request: Request, node: Node) -> tuple[str, ...] | None:
    options = placements(ctx.mix(), ledger, request, node)
    return best_placement(options)[1] if options else None


GRADIENT_FIT = Policy("gradient-fit", "placeholder", _key, _pick, Capabilities(needs_mix=True, unique_keys=True))
