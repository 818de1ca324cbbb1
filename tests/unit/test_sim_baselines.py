"""The FGD study's baselines and frag-gradient: scores against their definitions."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from packing.ledger import Ledger
from packing.products import Request
from simulations import baselines, registry  # noqa: F401  (registers the policies)
from simulations.baselines import fgd_choice, fgd_score, go_best_fit_score
from simulations.fragpolicy import FRAG_GRADIENT
from simulations.mix import TypicalMix, TypicalPod


def test_go_best_fit_score_is_the_artifacts_formula() -> None:
    # 1 − [0.5·(64000 − 8000)/128000 + 0.5·(3000 − 500)/8000] = 1 − (0.21875 + 0.15625) = 0.625
    assert go_best_fit_score(64000, 3000, 8000, 500) == 62
    assert go_best_fit_score(8000, 500, 8000, 500) == 100  # a perfect fit
    assert go_best_fit_score(128000, 8000, 0, 0) == 0


def brute_fragment(mix: TypicalMix, cpu: int | None, frees: list[int]) -> float:
    """FGD's definition read literally (frag.go NodeGpuShareFragAmount), pod by typical pod."""
    total = 0.0
    idle = sum(frees)
    for m in mix.pods:
        if m.milli == 0:
            total += m.weight * idle  # CPU-only typical pods: all idle GPU counts (XL / XR)
            continue
        cpu_ok = cpu is None or cpu >= m.cpu_milli
        gpu_ok = sum(1 for f in frees if f >= m.milli) >= m.count
        if cpu_ok and gpu_ok:
            total += m.weight * sum(f for f in frees if f < m.milli)
        else:
            total += m.weight * idle
    return total


typical = st.lists(st.builds(TypicalPod, cpu_milli=st.integers(0, 32000), milli=st.sampled_from([0, 230, 470, 810,
                                                                                                 1000]),
                             count=st.sampled_from([1, 1, 2]), weight=st.floats(0.01, 1.0)), min_size=1, max_size=8)


@settings(max_examples=200, deadline=None)
@given(pods=typical, cpu=st.none() | st.integers(0, 96000), frees=st.lists(st.integers(0, 1000), max_size=8))
def test_decomposed_fragment_equals_the_definition(pods: list[TypicalPod], cpu: int | None,
                                                   frees: list[int]) -> None:
    pods = [TypicalPod(p.cpu_milli, p.milli, p.count if p.milli == 1000 else 1, p.weight) for p in pods]
    mix = TypicalMix(pods)
    assert math.isclose(mix.fragment(cpu, tuple(frees)), brute_fragment(mix, cpu, frees), abs_tol=1e-6)


def node_with(frees: list[int], cpu: int = 96000) -> Ledger:
    ledger = Ledger()
    ledger.add_node("n", [(f"g{i}", "G2", 0) for i in range(len(frees))], cpu_milli=cpu, memory_mib=1 << 20)
    for i, f in enumerate(frees):
        if f < 1000:
            ledger.assign(f"fill{i}", Request(milli=1000 - f, cpu_milli=0), "n", (f"g{i}",))
    return ledger


def test_fgd_prefers_the_gpu_that_keeps_whole_cards_usable() -> None:
    mix = TypicalMix([TypicalPod(0, 1000, 1, 0.5), TypicalPod(0, 500, 1, 0.5)])
    ledger = node_with([1000, 500])
    choice = fgd_choice(ledger, Request(milli=500), ledger.nodes["n"], mix)
    assert choice is not None
    gain, gpus = choice
    assert gpus == ("g1",)  # filling the half-used card keeps the empty one for a whole-card pod
    before = brute_fragment(mix, 96000, [1000, 500])
    after = brute_fragment(mix, 96000, [1000, 0])
    assert math.isclose(gain, before - after)
    assert fgd_score(gain) == int(100 / (1 + math.exp(-gain / 1000)))


def test_frag_gradient_never_leaves_ties() -> None:
    ledger = Ledger()
    for i in range(6):
        ledger.add_node(f"n{i}", [(f"n{i}g{j}", "G2", 0) for j in range(2)], cpu_milli=32000, memory_mib=1 << 20)
    baselines.prepare(0, [Request(milli=500), Request(milli=1000)])
    keys = FRAG_GRADIENT.keys(ledger, Request(milli=500), ledger.nodes)
    assert len(set(keys.values())) == len(keys) == 6  # equal states, distinct keys: the order decides
    assert FRAG_GRADIENT.best_nodes(ledger, Request(milli=500)) == ["n0"]
