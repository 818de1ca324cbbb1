"""``relative-gradient``: fragment-gradient levels in steps of the request's own size.

With ``gain`` the largest drop in expected fragment over the node's placements (``packing.policies.fgd``,
the mix learnt online as for ``gradient-fit``) and ``size`` the request's GPU milli (cards × milli),
the key (lower is better) on a node where the request fits is

    a request with GPUs:    (−⌊gain / (STEP · size)⌋, fractional request and all cards empty, node order)
    a request without GPU:  (idle GPU milli of the node, −fgd_score(gain), node order)

1. **relative levels**: two nodes tie when their gains fall in the same step of ``STEP`` (12 %) of
   what the pod asks; FGD's ``int(100·sigmoid(gain/1000))`` steps by about 40 milli near 0
   whatever the size;
2. **consolidation for fractional requests only**: a slice goes to a node already holding work
   before an untouched one; whole cards follow the node order (first fit among equals);
3. **best fit for GPU-less pods**, as in ``gradient-fit``.

Measured on ``openb`` (``simulations/README.md``): on the model-pinned ``gpuspec*`` lists it packs
0.08–0.94 point better than FGD's levels; on the plain ones it is worse than ``gradient-fit``'s
own slice steps (``default`` 4.86 against 4.55, ``gpushare100`` 13.41 against 13.24). So it is not
the default, which takes this key only while models constrain the typical pods (``gradient-fit``).
The pick inside the node is FGD's.
"""

from __future__ import annotations

import math

from packing.ledger import Ledger, Node
from packing.policies.base import Capabilities, NodeKey, Policy, PolicyContext
from packing.policies.fgd import Placement, fgd_pick, gpu_less_key, placements
from packing.products import Request

STEP = 0.12  # one level: a fragment gain of 12 % of the request's GPU milli


def relative_level(gain: float, request: Request, step: float = STEP) -> int:
    """⌊gain / (step · the request's GPU milli)⌋ (a request with GPUs)."""
    return math.floor(gain / (step * request.total_milli))


def relative_key(options: list[Placement], request: Request, node: Node, step: float = STEP) -> NodeKey:
    """The key on ``node`` of a request with GPUs, given its ``placements`` there (not empty), in
    levels of ``step`` × its size."""
    untouched = not request.whole and all(g.empty for g in node.gpus)
    return (-relative_level(max(o[0] for o in options), request, step), untouched, node.order)


def _key(ctx: PolicyContext, ledger: Ledger, request: Request, node: Node) -> NodeKey | None:
    options = placements(ctx.mix(), ledger, request, node)
    if not options:
        return None
    return gpu_less_key(options, node) if request.gpu_less else relative_key(options, request, node)


RELATIVE_GRADIENT = Policy(
    "relative-gradient",
    "fragment-gradient levels in steps of 12 % of the request, consolidation for slices, best fit for GPU-less pods",
    _key,
    fgd_pick,
    Capabilities(indexed=True, key_index=True, needs_mix=True, unique_keys=True),
)
