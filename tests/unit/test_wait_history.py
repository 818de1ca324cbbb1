"""``packing.wait_history``: the recent waits per product, what a waiting claim is told, and the rough
durations its pod condition shows."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packing.explain import Explanation, about, expected_text
from packing.products import load_catalog
from packing.wait_history import WaitHistory, kind_of

CATALOG = load_catalog()


def test_a_product_says_nothing_before_min_seen_then_its_quantiles() -> None:
    h = WaitHistory(window=100, min_seen=5)
    for w in (10.0, 20.0, 30.0, 40.0):
        h.add("v100-50", w)
    assert h.quantile("v100-50", 0.5) is None and h.lately("v100-50") is None and h.products() == []
    h.add("v100-50", 50.0)
    assert h.quantile("v100-50", 0.5) == 30.0 and h.quantile("v100-50", 0.9) == 50.0
    assert h.quantile("v100-50", 0.0) == 10.0 and h.products() == ["v100-50"]
    lately = h.lately("v100-50")
    assert lately is not None and (lately.summary.median, lately.summary.p90, lately.summary.seen) == (30.0, 50.0, 5)


def test_the_expected_wait_is_conditional_on_what_was_waited() -> None:
    h = WaitHistory(window=100, min_seen=1)
    for w in (0.0, 0.0, 0.0, 60.0, 600.0, 3600.0):
        h.add("v100-100", w)
    lately = h.lately("v100-100")
    assert lately is not None
    assert lately.remaining(0.0) == 600.0  # the median of 60, 600, 3600: the three that waited longer than 0
    assert lately.remaining(100.0) == 500.0  # of 600 and 3600, the lower middle one, less the 100 s waited
    assert lately.remaining(3600.0) is None  # nobody waited longer: the text says so


def test_the_window_keeps_the_latest_and_negative_waits_count_as_zero() -> None:
    h = WaitHistory(window=3, min_seen=1)
    for w in (100.0, 200.0, 300.0, -5.0):
        h.add("q", w)
    h.verify()
    assert h.seen("q") == 3 and h.quantile("q", 0.0) == 0.0 and h.quantile("q", 1.0) == 300.0


@settings(max_examples=100)
@given(st.lists(st.tuples(st.sampled_from(["a", "b"]), st.floats(0, 1e6)), max_size=60), st.integers(1, 10))
def test_the_indexes_agree_after_any_adds(adds: list[tuple[str, float]], window: int) -> None:
    h = WaitHistory(window=window, min_seen=1)
    for product, w in adds:
        h.add(product, w)
    h.verify()
    for product in ("a", "b"):
        recent = [w for p, w in adds if p == product][-window:]
        assert h.seen(product) == len(recent)
        if recent:
            assert h.quantile(product, 1.0) == max(recent)


def test_kinds_keep_multi_card_requests_apart() -> None:
    assert kind_of(CATALOG.request("v100-100")) == "v100-100"
    assert kind_of(CATALOG.request("v100-100", count=4)) == "v100-100x4"
    assert kind_of(CATALOG.request("v100-25")) == "v100-25"


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "under a minute"), (29, "under a minute"), (45, "1 min"), (100, "2 min"), (250, "5 min"),
    (800, "15 min"), (3000, "45 min"), (3700, "1 h"), (4 * 3600 + 100, "4 h"), (2 * 86400, "2 d"),
    (10 * 86400, "more than 2 d"),
])
def test_about_rounds_to_a_few_steps(seconds: float, text: str) -> None:
    assert about(seconds) == text


def test_expected_text_is_empty_without_history() -> None:
    e = Explanation("c", "ns", "v100-25", 1, 1, "NoCapacity", "m", 3.0)
    assert expected_text(e) == ""
