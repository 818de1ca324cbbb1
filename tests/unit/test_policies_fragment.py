"""FGD's fragmentation measure (``packing.fragment``) against its definition read literally."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packing.fragment import TypicalMix, TypicalPod, per_card_weights, shape_of
from packing.mix_estimator import MixEstimator, catalog_prior
from packing.products import Request, load_catalog
from packing.products import model_accepts as accepts

MODELS = ("G2", "T4", "V100M32")


def brute_fragment(mix: TypicalMix, cpu: int | None, mem: int | None, cards: list[tuple[str, int]]) -> float:
    """frag.go ``NodeGpuShareFragAmount``, typical pod by typical pod, models included (``NoAccess``)."""
    total = 0.0
    idle = sum(f for _, f in cards)
    for m in mix.pods:
        if m.milli == 0:
            total += m.weight * idle  # GPU-less typical pods: all idle GPU counts (XL / XR)
            continue
        host_ok = (cpu is None or cpu >= m.cpu_milli) and (mem is None or mem >= m.memory_mib)
        usable = [f for model, f in cards if f >= m.milli and accepts(m.model, model)]
        if host_ok and len(usable) >= m.count:
            total += m.weight * (idle - sum(usable))
        else:
            total += m.weight * idle
    return total


typical = st.lists(st.builds(TypicalPod, cpu_milli=st.integers(0, 32000),
                             milli=st.sampled_from([0, 230, 470, 810, 1000]), count=st.sampled_from([1, 1, 2]),
                             weight=st.floats(0.01, 1.0), model=st.sampled_from([None, None, "T4", "G2|V100M*"]),
                             memory_mib=st.sampled_from([0, 0, 16384, 65536])),
                   min_size=1, max_size=8)
cards = st.lists(st.tuples(st.sampled_from(MODELS), st.integers(0, 1000)), max_size=8)


@settings(max_examples=300, deadline=None)
@given(pods=typical, cpu=st.none() | st.integers(0, 96000), mem=st.none() | st.integers(0, 131072), node=cards)
def test_decomposed_fragment_equals_the_definition(pods: list[TypicalPod], cpu: int | None, mem: int | None,
                                                   node: list[tuple[str, int]]) -> None:
    pods = [TypicalPod(p.cpu_milli, p.milli, p.count if p.milli == 1000 else 1, p.weight, p.model, p.memory_mib)
            for p in pods]
    mix = TypicalMix(pods)
    got = mix.fragment(cpu, mem, node)
    assert math.isclose(got, brute_fragment(mix, cpu, mem, node), abs_tol=1e-6)
    assert mix.fragment(cpu, mem, list(reversed(node))) == got  # the memo is order-free


# (typical pods, CPU free, cards, F): worked examples of the definition
TABLE = [
    # one whole-card pod: the half-used card is all fragment, the empty one is usable
    ([TypicalPod(0, 1000, 1, 1.0)], None, [("G2", 1000), ("G2", 500)], 500.0),
    # the same pod lacks CPU: everything idle is fragment
    ([TypicalPod(8000, 1000, 1, 1.0)], 4000, [("G2", 1000), ("G2", 500)], 1500.0),
    # a pod pinned to T4 cannot use G2 cards at all (NoAccess)
    ([TypicalPod(0, 250, 1, 1.0, "T4")], None, [("G2", 1000)], 1000.0),
    # half weight on a 500-milli pod that fits both cards, half on a whole card
    ([TypicalPod(0, 500, 1, 0.5), TypicalPod(0, 1000, 1, 0.5)], None, [("G2", 1000), ("G2", 500)], 250.0),
    # two whole cards wanted, one empty: the node cannot host it
    ([TypicalPod(0, 1000, 2, 1.0)], None, [("G2", 1000), ("G2", 0)], 1000.0),
]


@pytest.mark.parametrize("pods, cpu, node, expected", TABLE)
def test_fragment_table(pods: list[TypicalPod], cpu: int | None, node: list[tuple[str, int]],
                        expected: float) -> None:
    assert TypicalMix(pods).fragment(cpu, None, node) == pytest.approx(expected)


def test_typical_pods_cover_95_percent_of_the_weight() -> None:
    requests = [Request(500)] * 60 + [Request(1000)] * 36 + [Request(250)] * 3 + [Request(125)]
    mix = TypicalMix.from_requests(requests)
    assert [(p.milli, round(p.weight, 4)) for p in mix.pods] == [(500, round(60 / 96, 4)), (1000, round(36 / 96, 4))]
    assert sum(p.weight for p in mix.pods) == pytest.approx(1.0)


PER_CARD = [
    # (shape, its weight, its weight per card): k-card shapes divided by k, one-card and GPU-less ones unchanged
    ((0, 0, 0, 0, None), 6.0, 6.0),
    ((0, 0, 250, 1, None), 6.0, 6.0),
    ((0, 0, 1000, 2, None), 6.0, 3.0),
    ((4000, 0, 1000, 8, "T4"), 6.0, 0.75),
]


@pytest.mark.parametrize("shape, weight, expected", PER_CARD)
def test_per_card_weights_divide_by_the_card_count(shape: tuple[int, int, int, int, str | None], weight: float,
                                                   expected: float) -> None:
    assert per_card_weights({shape: weight}) == {shape: expected}


def test_per_card_mix_weighs_multi_card_shapes_less_and_cuts_coverage_after() -> None:
    weights = {shape_of(Request(1000)): 60.0, shape_of(Request(1000, count=8)): 20.0}
    assert {(p.count, p.weight) for p in TypicalMix.from_weights(weights).pods} == {(1, 0.75), (8, 0.25)}
    per_card = TypicalMix.from_weights(weights, coverage=1.0, per_card=True).pods
    assert {(p.count, p.weight) for p in per_card} == {(1, 0.96), (8, 0.04)}
    # 2.5 of 62.5 is below the 5 % that 95 % coverage leaves out: the 8-card shape is no typical pod
    assert [p.count for p in TypicalMix.from_weights(weights, per_card=True).pods] == [1]


def test_per_card_keeps_the_pods_weights_where_models_constrain() -> None:
    weights = {shape_of(Request(1000, model="T4")): 60.0, shape_of(Request(1000, count=8)): 20.0}
    mix = TypicalMix.from_weights(weights, per_card=True)
    assert mix.mixed_models and {(p.count, p.weight) for p in mix.pods} == {(1, 0.75), (8, 0.25)}


def test_host_memory_is_kept_or_merged() -> None:
    requests = [Request(500, host_memory_mib=1024), Request(500, host_memory_mib=2048)]
    assert len(TypicalMix.from_requests(requests, coverage=1.0).pods) == 2
    merged = TypicalMix.from_requests(requests, coverage=1.0, host_memory=False).pods
    assert [(p.milli, p.memory_mib, p.weight) for p in merged] == [(500, 0, 1.0)]


def test_shapes_and_model_patterns() -> None:
    assert shape_of(Request(250, cpu_milli=3, host_memory_mib=4, model="T4")) == (3, 4, 250, 1, "T4")
    assert accepts(None, "anything") and accepts("V100M16|V100M32", "V100M32")
    assert not accepts("V100M16|V100M32", "T4") and accepts("Tesla-V100-*-32GB", "Tesla-V100-SXM2-32GB")


def test_mixed_models_when_the_pods_with_gpus_name_several_patterns() -> None:
    one = TypicalMix([TypicalPod(0, 500, 1, 0.5, "Tesla-V100-*"), TypicalPod(0, 1000, 2, 0.5, "Tesla-V100-*")])
    assert not one.mixed_models and not TypicalMix([TypicalPod(0, 500, 1, 1.0)]).mixed_models
    assert TypicalMix([TypicalPod(0, 500, 1, 0.5), TypicalPod(0, 1000, 1, 0.5, "A100*")]).mixed_models
    # a GPU-less pod names no card model, whatever its pattern
    assert not TypicalMix([TypicalPod(0, 500, 1, 0.5), TypicalPod(4000, 0, 0, 0.5, "A100*")]).mixed_models
    # the extender's cold start and claims on a V100-only catalog: one pattern, gradient-fit never switches
    catalog = load_catalog()
    estimator = MixEstimator(prior=catalog_prior(catalog))
    for name in ("v100-25", "v100-100", "v100-50"):
        estimator.observe(catalog.request(name))
    assert estimator.mix().pods and not estimator.mix().mixed_models
