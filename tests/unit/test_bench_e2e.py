"""The real-path bench's own arithmetic: configurations, the webhook's p99 from a histogram, the CI guard."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from tests.bench.bench_e2e import Burst, guard, histogram_quantile, kind_ms, mean_ms_by_kind, parse_config


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


def test_mean_time_per_request_kind_between_two_scrapes() -> None:
    def scrape(patches: float, patch_s: float, watches: float) -> list[tuple[str, dict[str, str], float]]:
        patch = {"verb": "PATCH", "resource": "pods", "subresource": "", "scope": "resource"}
        watch = {"verb": "WATCH", "resource": "pods", "subresource": ""}
        return [("apiserver_request_duration_seconds_count", patch, patches),
                ("apiserver_request_duration_seconds_sum", patch, patch_s),
                ("apiserver_request_duration_seconds_count", {**patch, "scope": "namespace"}, 1.0),
                ("apiserver_request_duration_seconds_sum", {**patch, "scope": "namespace"}, 0.0),
                ("apiserver_request_duration_seconds_count", watch, watches),
                ("apiserver_request_duration_seconds_sum", watch, watches * 60)]

    # 100 PATCHes in 5 s between the scrapes (both scopes summed), 0.05 s each; no WATCH (long-running)
    means = mean_ms_by_kind(scrape(10, 1.0, 1), scrape(110, 6.0, 3))
    assert means == {("PATCH", "pods", ""): pytest.approx(50.0)}
    b = burst("deployed", 0, 1.0)
    b.request_ms = means
    assert kind_ms([b], ("PATCH", "pods", "")) == " (50 ms)"
    assert kind_ms([b], ("POST", "pods", "")) == ""
