"""The FGD study's baselines as ``packing`` policies, so the engine keeps one placement path.

Registered on import (``packing.policies.register_policy``):

* ``random``: a uniformly random node among those that fit; inside it, a random GPU that fits
  (the artifact's ``random_score.go`` with ``allocateGpuIdBasedOnRandomFit``);
* ``go-best-fit``: node score ``int(100·(1 − [0.5·(cpu_left − req)/128000 + 0.5·(gpu_left −
  req)/8000]))`` on the node's total idle GPU, then the tightest GPU inside (``best_fit_score.go``);
* ``fgd``: FGD's score ``int(100·sigmoid((F_before − F_after)/1000))`` over the workload's
  typical mix (``fgd_score.go``), the GPU inside being the one with the best score.

These exist to reproduce the published numbers, not for production. Randomness comes from this
module's generator, reseeded per run with ``prepare``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from packing.ledger import Ledger, Node
from packing.policies import BEST_FIT, POLICIES, NodeKey, Policy, register_policy
from packing.products import Request
from simulations.mix import TypicalMix, current_mix, set_mix

MAX_SPEC_CPU = 128000  # the artifact's normalisation constants (gpushareutils.MaxSpecCpu / MaxSpecGpu)
MAX_SPEC_GPU = 8000
REJECTION_TRIES = 32  # random draws before falling back to listing every fitting node

_rng = random.Random(0)


def prepare(seed: int, requests: Sequence[Request]) -> None:
    """Reseed the random baseline and set the typical mix FGD scores against, for one run."""
    _rng.seed(seed)
    set_mix(TypicalMix.from_requests(requests))


# ---- random fit ---------------------------------------------------------------------------------


def _random_key(ledger: Ledger, request: Request, node: Node) -> NodeKey | None:
    return (_rng.random(),) if ledger.fits_on(node, request) else None


def _random_pick(ledger: Ledger, request: Request, node: Node) -> tuple[str, ...] | None:
    if not ledger.fits_on(node, request):
        return None
    if request.gpu_less:
        return ()
    gpus = ledger.fitting_gpus(node, request)
    if request.whole:
        return tuple(g.uuid for g in sorted(gpus, key=lambda g: g.index)[: request.count])
    return (_rng.choice(gpus).uuid,)


@dataclass(frozen=True)
class SampledPolicy(Policy):
    """A policy whose best node is one uniform draw among the fitting nodes (no scan needed)."""

    self_indexed = True

    def best_nodes(self, ledger: Ledger, request: Request, nodes: Collection[str] | None = None) -> list[str]:
        names = list(ledger.nodes if nodes is None else nodes)
        if not names:
            return []
        for _ in range(REJECTION_TRIES):
            node = ledger.nodes.get(_rng.choice(names))
            if node is not None and ledger.fits_on(node, request):
                return [node.name]
        fitting = [n for n in names if n in ledger.nodes and ledger.fits_on(ledger.nodes[n], request)]
        return [_rng.choice(fitting)] if fitting else []


RANDOM_FIT = SampledPolicy("random", "a random node that fits, a random GPU that fits (FGD baseline)",
                           _random_key, _random_pick)


# ---- Go-style best fit --------------------------------------------------------------------------


def go_best_fit_score(cpu_left: int, gpu_left: int, cpu_req: int, gpu_req: int) -> int:
    """The artifact's integer score (higher is better), with Go's float operations in Go's order."""
    score = 0.0
    score += (cpu_left - cpu_req) / MAX_SPEC_CPU * 0.5
    score += (gpu_left - gpu_req) / MAX_SPEC_GPU * 0.5
    return int((1.0 - score) * 100)


def _go_best_fit_key(ledger: Ledger, request: Request, node: Node) -> NodeKey | None:
    if not ledger.fits_on(node, request):
        return None
    cpu_left = node.free_cpu if node.cpu_milli is not None else request.cpu_milli
    return (-go_best_fit_score(cpu_left, node.free_gpu_milli, request.cpu_milli, request.total_milli),)


GO_BEST_FIT = Policy("go-best-fit", "FGD baseline: integer node score on CPU and total idle GPU, tightest GPU inside",
                     _go_best_fit_key, BEST_FIT.pick_on)


# ---- FGD ------------------------------------------------------------------------------------------


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def fgd_choice(ledger: Ledger, request: Request, node: Node, mix: TypicalMix) -> tuple[float, tuple[str, ...]] | None:
    """(F_before − F_after, GPUs) of FGD's best GPU choice on ``node``, or None when it does not fit."""
    if not ledger.fits_on(node, request):
        return None
    frees = [g.free_milli for g in node.gpus]
    cpu = node.free_cpu if node.cpu_milli is not None else None
    cpu_after = None if cpu is None else cpu - request.cpu_milli
    before = mix.fragment(cpu, tuple(frees))
    if request.gpu_less:
        return before - mix.fragment(cpu_after, tuple(frees)), ()
    if request.whole:
        chosen = [g for g in sorted(ledger.fitting_gpus(node, request), key=lambda g: g.index)][: request.count]
        after = list(frees)
        for g in chosen:
            after[g.index] -= request.milli
        return before - mix.fragment(cpu_after, tuple(after)), tuple(g.uuid for g in chosen)
    best: tuple[float, str] | None = None
    seen: set[int] = set()
    for g in ledger.fitting_gpus(node, request):  # index order; equal free shares score alike
        if g.free_milli in seen:
            continue
        seen.add(g.free_milli)
        after = list(frees)
        after[g.index] -= request.milli
        gain = before - mix.fragment(cpu_after, tuple(after))
        if best is None or fgd_score(gain) > fgd_score(best[0]):
            best = (gain, g.uuid)
    assert best is not None, "fits_on promised a GPU"
    return best[0], (best[1],)


def fgd_score(gain: float) -> int:
    """FGD's integer node score for a drop in expected fragment of ``gain`` milli."""
    return int(sigmoid(gain / 1000) * 100)


def _fgd_key(ledger: Ledger, request: Request, node: Node) -> NodeKey | None:
    choice = fgd_choice(ledger, request, node, current_mix())
    return None if choice is None else (-fgd_score(choice[0]),)


def _fgd_pick(ledger: Ledger, request: Request, node: Node) -> tuple[str, ...] | None:
    choice = fgd_choice(ledger, request, node, current_mix())
    return None if choice is None else choice[1]


FGD = Policy("fgd", "FGD re-implementation: integer sigmoid of the drop in expected fragment (ATC'23)",
             _fgd_key, _fgd_pick)

BASELINES: tuple[Policy, ...] = (RANDOM_FIT, GO_BEST_FIT, FGD)

for _policy in BASELINES:
    if _policy.name not in POLICIES:  # a re-import must not register twice
        register_policy(_policy)
