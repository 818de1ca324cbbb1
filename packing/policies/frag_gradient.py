"""``frag-gradient``: FGD's fragment-gradient levels, with ties broken by the policy itself.

Key (lower is better) on a node where the request fits, with ``level = fgd_score(gain)`` of the
node's best placement (``packing.policies.fgd``):

    (−level, idle GPU milli if the request needs no GPU else 0, all cards empty, node order)

1. a GPU-less pod goes to the node with the least idle GPU among the best level;
2. a node already holding GPU work before a node whose cards are all empty (consolidate);
3. the node order: keys are unique, so the extender's filter narrows to one node and
   kube-scheduler's random tie-breaking cannot undo the packing (FGD loses 5 points to it).

The pick is FGD's. The mix is learnt online (``packing.mix_estimator``), as a cluster sees it.
"""

from __future__ import annotations

from packing.ledger import Ledger, Node
from packing.policies.base import Capabilities, NodeKey, Policy, PolicyContext
from packing.policies.fgd import best_placement, fgd_pick, fgd_score, placements
from packing.products import Request


def _key(ctx: PolicyContext, ledger: Ledger, request: Request, node: Node) -> NodeKey | None:
    options = placements(ctx.mix(), ledger, request, node)
    if not options:
        return None
    level = fgd_score(best_placement(options)[0])
    idle = node.free_gpu_milli if request.gpu_less else 0
    untouched = all(g.empty for g in node.gpus)
    return (-level, idle, untouched, node.order)


FRAG_GRADIENT = Policy(
    "frag-gradient",
    "FGD's fragment-gradient levels, ties broken by the policy itself (immune to random ties)",
    _key,
    fgd_pick,
    Capabilities(indexed=True, key_index=True, needs_mix=True, unique_keys=True),
)
