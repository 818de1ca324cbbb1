"""The real-path bench's own arithmetic: configurations, the webhook's p99 from a histogram, the CI guard."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from tests.bench.bench_e2e import Burst, guard, histogram_quantile, parse_config


def test_configurations_name_mode_policy_and_source() -> None:
    assert parse_config("deployed") == ("deployed", "", "")
    assert parse_config("deployed:best-fit") == ("deployed", "best-fit", "")
    assert parse_config("nogate:best-fit@main") == ("nogate", "best-fit", "main")


def test_quantile_interpolates_inside_its_bucket_as_prometheus_does() -> None:
    # 100 calls: 10 under 5 ms, 85 between 5 and 25 ms, 5 between 25 and 100 ms
    buckets = {"0.005": 10, "0.025": 95, "0.1": 100, "+Inf": 100}
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.005 + 0.020 * 40 / 85)
    assert histogram_quantile(0.99, buckets) == pytest.approx(0.025 + 0.075 * 4 / 5)
    assert histogram_quantile(0.99, {"0.005": 0, "+Inf": 10}) == 0.005  # beyond the last bound: that bound
    assert math.isnan(histogram_quantile(0.99, {"0.005": 0, "+Inf": 0}))


def burst(config: str, round_: int, extender_ms: float) -> Burst:
    return Burst(config, round_, 10, 10, 1.0, 1.0, 0, [1.0], {"extender": extender_ms}, 0.0, Counter(), 0.0, 0.0,
                 0.0, 0.0, 0.0)


def test_guard_fails_only_above_its_ratio_of_the_same_rounds() -> None:
    by = {"deployed": [burst("deployed", 0, 14.0)], "deployed:best-fit": [burst("deployed:best-fit", 0, 10.0)]}
    assert guard(by, 1.5)
    assert not guard(by, 1.3)
    assert not guard({"deployed": by["deployed"]}, 1.5), "without best fit's figures it cannot pass"
