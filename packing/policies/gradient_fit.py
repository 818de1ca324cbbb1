"""``gradient-fit`` (the default): while the cluster fills, the fragment gradient in levels fit to the request,
consolidation, best fit for pods without a GPU; once departures keep pace with arrivals, best fit.

While the cluster fills (``packing.load_phase``: fewer than 0.5 decayed departures per arrival),
with ``gain`` the drop in the expected fragment of the workload's typical pods on the node
(``packing.policies.fgd``), the key (lower is better) on a node where the request fits is

    a slice (a fraction of one card):  (−⌊gain / (16 % of the milli it asks)⌋, all cards of the node empty, node order)
    whole cards:                       (−fgd_score(gain), all cards of the node empty, node order)
    a request without GPU:             (idle GPU milli of the node, −fgd_score(gain), node order)

with ``gain`` the largest over the node's placements and ``fgd_score(gain) = int(100·sigmoid(gain/1000))``,
FGD's level. Once the cluster churns, the key of every request is ``(best-fit's key, node order)``
(``packing.policies.best_fit``).

1. **the gradient** places a slice where it strands least of what the typical pods need: a
   card whose leftover they can still use, a node whose CPU and RAM still serve its idle cards;
2. **levels fit to the request**: a slice's level is a step of 16 % of its own size (40 milli for
   a quarter card, 80 for a half), so a difference in gain counts by what the slice occupies; FGD's
   sigmoid steps by about 40 milli near 0 and ever coarser beyond, whatever the size. Whole cards
   keep FGD's levels: relative steps for them measured worse (``simulations/README.md``);
3. **consolidation**: within a level, a node already holding work before an untouched one, then
   the node order (first fit among equals). Keys are unique per node, so strict filter narrows to
   one node and kube-scheduler's random tie-breaking cannot undo the packing (FGD, whose 101
   levels leave ties, loses about 5 points of GPU to random ties on ``openb``);
4. **best fit for GPU-less pods**: a pod that needs only CPU and RAM goes first to the node with
   the least idle GPU, where its CPU strands nothing, whatever the level says (on ``openb``'s
   CPU-heavy mixes, ``cpu200``–``cpu300``, this is worth up to a point of GPU over
   ``frag-gradient``, which puts the level first);
5. **models**: while the typical pods name more than one GPU model pattern
   (``TypicalMix.mixed_models``), every request with GPUs takes ``relative-gradient``'s key
   instead, levels in steps of 12 % of its own size and consolidation for slices only. The gain
   then hangs on the estimated share of each pinned shape, and FGD's fine levels follow that
   estimate's noise (on ``gpuspec33`` the mix known in advance packs half a point better than the
   mix learnt online); these steps measured 0.08–0.94 point better on all five ``gpuspec`` lists.
   A cluster of one model, the catalog's V100 included, never switches.

6. **a mix per card**: the typical pods weigh a k-card shape 1/k of its claims
   (``packing.fragment.per_card_weights``). Weighed by its pods, as FGD does, an 8-card shape's
   fragment, all of the idle GPU of a node with fewer than 8 free cards, drowns what the one-card
   pods would strand there; per card, on ``openb``'s ``multigpu*`` lists it packed better than FGD
   (``simulations/README.md``). Lists with few multi-card pods barely change; where models
   constrain, the mix stays by pods;
7. **best fit under churn**: once departures keep pace with arrivals (``LoadPhase.churning``), the
   key is ``best-fit``'s followed by the node order, and the pick its tightest card(s). In FGD's
   setting (no departures) the gradient packs 0.4–9.8 points of GPU better than best fit; with
   departures (protocol B, ρ 0.85) it bought nothing on single-card ``default`` and ``gpushare100``
   and cost 240 ± 155 min of p99 wait on ``multigpu50`` (``simulations/README.md``). Protocol A
   has no departures: there the phase never leaves filling.

While filling, the pick inside the node is FGD's. The mix is learnt online from the claims that arrive
(``packing.mix_estimator``), in the extender and in the simulator alike. Why it is the default,
with the measurements: ``simulations/README.md``.

**Cost**: every key above is a part read from the node's capacity state followed by its order
(``key_index``), so an instance from ``policy_for`` ranks nodes in a ``packing.key_index.KeyIndex``:
a decision is O(log n), like best fit's, and a new mix snapshot or a phase flip re-ranks one key per
distinct node state, not per node. Its answers are a scan's (property-tested).
"""

from __future__ import annotations

from packing.ledger import Ledger, Node
from packing.policies.base import Capabilities, NodeKey, Policy, PolicyContext
from packing.policies.best_fit import BEST_FIT, best_fit_key
from packing.policies.fgd import best_placement, fgd_pick, fgd_score, gpu_less_key, placements
from packing.policies.relative_gradient import relative_key
from packing.products import Request

SLICE_STEP = 0.16  # one level of a slice: a fragment gain of 16 % of the milli it asks


def _key(ctx: PolicyContext, ledger: Ledger, request: Request, node: Node) -> NodeKey | None:
    if ctx.churning:
        key = best_fit_key(ledger, request, node)
        return None if key is None else (*key, node.order)
    mix = ctx.mix()
    options = placements(mix, ledger, request, node)
    if not options:
        return None
    if request.gpu_less:
        return gpu_less_key(options, node)
    if mix.mixed_models:
        return relative_key(options, request, node)
    if not request.whole:
        return relative_key(options, request, node, SLICE_STEP)
    return (-fgd_score(best_placement(options)[0]), all(g.empty for g in node.gpus), node.order)


def _pick(ctx: PolicyContext, ledger: Ledger, request: Request, node: Node) -> tuple[str, ...] | None:
    return BEST_FIT.pick_fn(ctx, ledger, request, node) if ctx.churning else fgd_pick(ctx, ledger, request, node)


GRADIENT_FIT = Policy(
    "gradient-fit",
    "while the cluster fills, fragment gradient of a mix learnt online per card, in steps of 16 % of a slice "
    "(FGD's levels for whole cards, 12 % steps for all where models constrain), consolidation, best fit for "
    "GPU-less pods; best fit once departures keep pace with arrivals (default)",
    _key,
    _pick,
    Capabilities(indexed=True, key_index=True, needs_mix=True, needs_phase=True, unique_keys=True, mix_per_card=True),
)
