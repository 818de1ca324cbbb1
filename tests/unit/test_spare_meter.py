"""``packing.admission.spare``: the cluster's spare GPU capacity lately, an exponential time mean normalised by
the weight seen so far (table test of the formula, then its invariants under any sequence of observations)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from packing.admission.spare import SpareMeter, spare_gpus
from tests.unit.queue_helpers import H, Q, ledger_with

WINDOW = 3600.0
E = math.e


@pytest.mark.parametrize(("observed", "at", "expected"), [
    ([], 0.0, None),  # nothing observed: no mean
    ([(0.0, 10.0)], 0.0, 10.0),  # one observation is all there is, at once
    ([(0.0, 10.0)], 1e6, 10.0),  # and for ever: a young meter is not pulled toward zero
    ([(0.0, 10.0), (WINDOW, 0.0)], WINDOW, 10.0),  # the 0 just began to stand: no weight yet
    # 10 for one window, then 0 for one: 10 e^-1 (1 - e^-1) / ((1 - e^-1) e^-1 + (1 - e^-1)) = 10 / (1 + e)
    ([(0.0, 10.0), (WINDOW, 0.0)], 2 * WINDOW, 10.0 / (1.0 + E)),
    ([(0.0, 4.0), (100.0, 4.0), (5000.0, 4.0)], 9000.0, 4.0),  # a steady capacity is its own mean
    # an observation dated earlier is made at the last one's time: it stands from then, with no weight yet
    ([(100.0, 8.0), (50.0, 2.0)], 100.0, 2.0),
    ([(0.0, 10.0), (WINDOW, 6.0), (0.0, 0.0)], WINDOW, 10.0),
    ([(0.0, 10.0), (WINDOW, 6.0), (0.0, 0.0)], 2 * WINDOW, 10.0 / (1.0 + E)),
])
def test_the_mean_weighs_each_capacity_by_how_long_it_stood_lately(
        observed: list[tuple[float, float]], at: float, expected: float | None) -> None:
    meter = SpareMeter(WINDOW)
    for now, spare in observed:
        meter.observe(now, spare)
        meter._check()
    got = meter.mean(at)
    assert got == expected if expected is None else got == pytest.approx(expected)


def test_spare_gpus_sums_the_free_milli_of_gpus_in_service() -> None:
    ledger = ledger_with(2, 2)
    assert spare_gpus(ledger) == 4.0
    ledger.assign("h", H, "n0", ("n0-gpu0",))
    ledger.assign("q", Q, "n1", ("n1-gpu1",))
    assert spare_gpus(ledger) == pytest.approx(4.0 - 0.5 - 0.25)
    ledger.withdraw("n1-gpu0")  # out of service: its room is no room
    assert spare_gpus(ledger) == pytest.approx(2.25)
    ledger.release("h")
    ledger.remove_node("n1")
    assert spare_gpus(ledger) == 2.0
    ledger.verify()


@given(st.lists(st.tuples(st.floats(0, 1e5), st.floats(0, 64)), min_size=1, max_size=40),
       st.floats(1.0, 1e5), st.floats(0, 2e5))
def test_the_mean_stays_between_the_least_and_the_most_observed(
        observed: list[tuple[float, float]], window: float, later: float) -> None:
    meter = SpareMeter(window)
    at = 0.0
    for step, spare in observed:
        at += step
        meter.observe(at, spare)
        meter._check()
    mean = meter.mean(at + later)
    spares = [s for _, s in observed]
    assert mean is not None and min(spares) - 1e-9 <= mean <= max(spares) + 1e-9
