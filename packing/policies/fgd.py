"""``fgd`` (baseline): Fragmentation Gradient Descent (Weng et al., USENIX ATC'23), re-implemented.

For every way to place the pod on a node (each card with a distinct free share, or the first k
empty cards), the gain is the drop in the node's expected fragment over the typical mix
(``packing.fragment``): gain = F(before) − F(after). Score ``int(100 · sigmoid(gain / 1000))``
(``fgd_score.go``), key = −score of the node's best placement, pick = that placement (the
first card in index order among equal scores). The 101 integer levels leave many nodes tied:
FGD packs well only under the artifact's patched scheduler, which breaks ties by a fixed node
order; under upstream's random ties it falls from 4.8 % to about 10 % unallocated GPU
(``simulations/README.md``).

Its mix is the whole workload, known in advance (``workload_mix``), as in the artifact; given
to ``policy_for`` as a ``FixedMix``. ``placements`` and ``fgd_score`` are shared with the
fragment-gradient policies.
"""

from __future__ import annotations

import math

from packing.fragment import TypicalMix
from packing.ledger import Ledger, Node
from packing.policies.base import Capabilities, NodeKey, Policy, PolicyContext
from packing.products import Request

Placement = tuple[float, tuple[str, ...], int]  # (gain, GPUs, milli left on the chosen card)


def sigmoid(x: float) -> float:
    """1 / (1 + e^−x), without overflow for large |x|."""
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


def fgd_score(gain: float) -> int:
    """FGD's integer node score for a drop in expected fragment of ``gain`` milli."""
    return int(sigmoid(gain / 1000) * 100)


def placements(mix: TypicalMix, ledger: Ledger, request: Request, node: Node) -> list[Placement]:
    """Every distinct placement of ``request`` on ``node`` with its gain; [] when it does not fit.

    Cards of one model with equal free shares are one placement (the lowest index stands for them).
    A withdrawn card is no capacity: it enters neither F nor the placements.
    """
    if not ledger.fits_on(node, request):
        return []
    cards = [(g.model, 0 if g.withdrawn else g.free_milli) for g in node.gpus]
    cpu = node.free_cpu if node.cpu_milli is not None else None
    mem = node.free_mem if node.memory_mib is not None else None
    before_cpu, before_mem = mix.host_rank(cpu, mem)
    after_cpu, after_mem = mix.host_rank(None if cpu is None else cpu - request.cpu_milli,
                                         None if mem is None else mem - request.host_memory_mib)
    before = mix.fragment_at(before_cpu, before_mem, tuple(sorted(cards)))
    if request.gpu_less:
        return [(before - mix.fragment_at(after_cpu, after_mem, tuple(sorted(cards))), (), 0)]
    fitting = ledger.fitting_gpus(node, request)
    if request.whole:
        chosen = sorted(fitting, key=lambda g: g.index)[: request.count]
        after = list(cards)
        for g in chosen:
            after[g.index] = (g.model, g.free_milli - request.milli)
        gain = before - mix.fragment_at(after_cpu, after_mem, tuple(sorted(after)))
        return [(gain, tuple(g.uuid for g in chosen), 0)]
    out: list[Placement] = []
    seen: set[tuple[str, int]] = set()
    for g in fitting:  # index order
        if (g.model, g.free_milli) in seen:
            continue
        seen.add((g.model, g.free_milli))
        after = list(cards)
        after[g.index] = (g.model, g.free_milli - request.milli)
        gain = before - mix.fragment_at(after_cpu, after_mem, tuple(sorted(after)))
        out.append((gain, (g.uuid,), g.free_milli - request.milli))
    return out


def best_placement(options: list[Placement]) -> Placement:
    """FGD's pick: the highest score, the first such in card order."""
    best = options[0]
    top = fgd_score(best[0])
    for p in options[1:]:
        s = fgd_score(p[0])
        if s > top:
            best, top = p, s
    return best


def gpu_less_key(options: list[Placement], node: Node) -> NodeKey:
    """A GPU-less pod's key where the gradient policies best-fit it: (idle GPU milli, −level, node
    order). Such a pod has one placement per node, so ``options`` holds exactly one."""
    return (node.free_gpu_milli, -fgd_score(options[0][0]), node.order)


def _key(ctx: PolicyContext, ledger: Ledger, request: Request, node: Node) -> NodeKey | None:
    options = placements(ctx.mix(), ledger, request, node)
    return (-fgd_score(best_placement(options)[0]),) if options else None


def fgd_pick(ctx: PolicyContext, ledger: Ledger, request: Request, node: Node) -> tuple[str, ...] | None:
    """FGD's GPU pick inside ``node`` (shared by the fragment-gradient policies)."""
    options = placements(ctx.mix(), ledger, request, node)
    return best_placement(options)[1] if options else None


FGD = Policy("fgd", "FGD baseline (ATC'23): integer sigmoid of the drop in expected fragment",
             _key, fgd_pick, Capabilities(needs_mix=True, workload_mix=True, baseline=True))
