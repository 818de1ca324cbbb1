"""``go-best-fit`` (baseline): the FGD artifact's Best-fit, an integer node score on CPU and idle GPU.

Score (higher is better, ``best_fit_score.go``), with Go's float operations in Go's order:
``int(100 · (1 − [0.5·(cpu_left − cpu_req)/128000 + 0.5·(gpu_left − gpu_req)/8000]))``, gpu_left
being the node's total idle milli; key = −score. Inside the node, the tightest card(s)
(``allocateGpuIdBasedOnBestFit``). Its 101 levels leave ties to the scheduler.
"""

from __future__ import annotations

from packing.ledger import Ledger, Node
from packing.policies.base import Capabilities, NodeKey, Policy, PolicyContext, pick_with, tightest
from packing.products import Request

MAX_SPEC_CPU = 128000  # the artifact's normalisation constants (gpushareutils.MaxSpecCpu / MaxSpecGpu)
MAX_SPEC_GPU = 8000


def go_best_fit_score(cpu_left: int, gpu_left: int, cpu_req: int, gpu_req: int) -> int:
    """The artifact's integer score (higher is better)."""
    score = 0.0
    score += (cpu_left - cpu_req) / MAX_SPEC_CPU * 0.5
    score += (gpu_left - gpu_req) / MAX_SPEC_GPU * 0.5
    return int((1.0 - score) * 100)


def _key(_ctx: PolicyContext, ledger: Ledger, request: Request, node: Node) -> NodeKey | None:
    if not ledger.fits_on(node, request):
        return None
    cpu_left = node.free_cpu if node.cpu_milli is not None else request.cpu_milli
    return (-go_best_fit_score(cpu_left, node.free_gpu_milli, request.cpu_milli, request.total_milli),)


GO_BEST_FIT = Policy("go-best-fit", "FGD baseline: integer node score on CPU and total idle GPU, tightest GPU inside",
                     _key, pick_with(tightest), Capabilities(baseline=True))
