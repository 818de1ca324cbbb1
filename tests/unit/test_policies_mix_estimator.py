"""The online mix estimator: converges on a stationary stream, halves old claims on schedule, starts from a prior."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packing.fragment import shape_of
from packing.mix_estimator import FixedMix, MixEstimator, catalog_prior
from packing.policies import policy_for
from packing.products import Request, load_catalog

SHAPES = [Request(250), Request(500), Request(1000), Request(1000, count=2), Request(0, count=0, cpu_milli=4000),
          Request(470, cpu_milli=8000)]


@settings(max_examples=40, deadline=None)
@given(weights=st.lists(st.floats(0.05, 1.0), min_size=1, max_size=len(SHAPES)), seed=st.integers(0, 10_000),
       half_life=st.sampled_from([50, 200]))
def test_the_estimate_converges_on_a_stationary_stream(weights: list[float], seed: int, half_life: int) -> None:
    shapes = SHAPES[: len(weights)]
    total = sum(weights)
    p = {shape_of(s): w / total for s, w in zip(shapes, weights, strict=True)}
    est = MixEstimator(half_life=half_life, refresh=half_life, coverage=1.0)
    rng = random.Random(seed)
    for r in rng.choices(shapes, weights, k=20 * half_life):  # long past the cold start
        est.observe(r)
    lam = 2 ** (-1 / half_life)
    n_eff = (1 + lam) / (1 - lam)  # the decayed histogram's effective sample: about 2.9 half-lives
    got = est.frequencies()
    for shape, q in p.items():
        assert abs(got.get(shape, 0.0) - q) <= 5 * math.sqrt(q * (1 - q) / n_eff) + 1e-9, (shape, got, p)
    published = {(t.cpu_milli, t.memory_mib, t.milli, t.count, t.model): t.weight for t in est.mix().pods}
    for shape, q in p.items():  # the snapshot scoring reads, at most one refresh old, converged too
        assert abs(published.get(shape, 0.0) - q) <= 5 * math.sqrt(q * (1 - q) / n_eff) + 1e-9, (shape, published)


def test_a_claims_weight_halves_every_half_life() -> None:
    est = MixEstimator(half_life=10, coverage=1.0)
    est.observe(Request(250))
    for _ in range(10):
        est.observe(Request(500))
    f = est.frequencies()
    newest = 2 ** (10 / 10)  # the last claim's weight, relative to the first one's 1
    assert f[shape_of(Request(250))] * newest == pytest.approx(1 / sum(2 ** (k / 10) for k in range(11)) * newest)
    assert f[shape_of(Request(250))] / f[shape_of(Request(500))] == pytest.approx(
        1 / sum(2 ** (k / 10) for k in range(1, 11)))


def test_snapshots_follow_every_claim_then_an_eighth_of_them_then_every_refresh() -> None:
    est = MixEstimator(half_life=100, refresh=4)
    versions = []
    for _ in range(60):
        est.observe(Request(250))
        versions.append(est.version)
    changed = [i + 1 for i in range(60) if i == 0 or versions[i] != versions[i - 1]]
    # every claim to 16 (a step of max(1, seen // 8)), steps of 2 and 3 to 33, then every 4
    assert changed == [*range(1, 17), 18, 20, 22, 24, 27, 30, 33, 37, 41, 45, 49, 53, 57]


def test_long_streams_do_not_overflow() -> None:
    est = MixEstimator(half_life=1, refresh=1)
    for i in range(3000):  # the claim weight would reach 2^3000 without rescaling
        est.observe(SHAPES[i % 2])
    f = est.frequencies()
    assert sum(f.values()) == pytest.approx(1.0) and all(math.isfinite(v) for v in f.values())
    assert f[shape_of(SHAPES[1])] == pytest.approx(2 / 3)  # with a half-life of one claim the last one weighs 2:1


def test_the_cold_start_is_the_catalogs_products() -> None:
    catalog = load_catalog()
    est = MixEstimator(prior=catalog_prior(catalog))
    assert sorted(p.milli for p in est.mix().pods) == [250, 500, 1000] and est.version == 0
    est.observe(catalog.request("v100-100"))
    assert max(est.mix().pods, key=lambda p: p.weight).milli == 1000


def test_a_fixed_mix_learns_nothing() -> None:
    mix = MixEstimator().mix()
    fixed = FixedMix(mix)
    fixed.observe(Request(250))
    assert fixed.mix() is mix and fixed.version == 0


def test_the_extender_and_the_simulator_share_the_estimator() -> None:
    policy = policy_for("gradient-fit", prior=catalog_prior(load_catalog()))
    assert isinstance(policy.context.mix_source, MixEstimator)


def test_a_per_card_estimator_weighs_multi_card_claims_by_their_cards() -> None:
    plain, per_card = MixEstimator(coverage=1.0), MixEstimator(coverage=1.0, per_card=True)
    for r in [Request(1000)] * 3 + [Request(1000, count=2)] * 2:
        plain.observe(r)
        per_card.observe(r)
    assert plain.frequencies() == pytest.approx(per_card.frequencies())  # the histogram itself is the claims'

    def two_cards_per_one(est: MixEstimator) -> float:
        weight = {p.count: p.weight for p in est.mix().pods}
        return weight[2] / weight[1]

    assert two_cards_per_one(per_card) == pytest.approx(two_cards_per_one(plain) / 2)
    default = policy_for("gradient-fit").context.mix_source
    assert isinstance(default, MixEstimator) and default.per_card
    other = policy_for("frag-gradient").context.mix_source
    assert isinstance(other, MixEstimator) and not other.per_card


@pytest.mark.parametrize("bad", [{"half_life": 0}, {"refresh": 0}, {"coverage": 0}, {"half_life": math.inf}])
def test_bad_settings_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        MixEstimator(**bad)  # type: ignore[arg-type]
