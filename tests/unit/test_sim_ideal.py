"""``simulations.ideal``: the no-fragmentation reference the fairness table sets every product's tail against."""

from __future__ import annotations

import math
import random

import pytest

from packing.products import Request, load_catalog
from simulations.ideal import alone_waits, product_waits, reference_waits
from simulations.traces import Job

CATALOG = load_catalog()


def jobs_of(*spec: tuple[str, float, float, int]) -> tuple[list[Job], list[Request]]:
    jobs = [Job(f"j{i}", a, d, 0, count=c, product=p) for i, (p, a, d, c) in enumerate(spec)]
    return jobs, [CATALOG.request(p, count=c) for p, _, _, c in spec]


def test_slices_pack_fluidly_and_whole_cards_take_what_is_left_in_order() -> None:
    # 2 cards: three halves need two cards (ceil 1.5) -- no fragmentation: the whole card waits for one
    jobs, reqs = jobs_of(("v100-50", 0, 100, 1), ("v100-50", 0, 100, 1), ("v100-50", 0, 50, 1),
                         ("v100-100", 1, 10, 1), ("v100-100", 2, 10, 1))
    waits = reference_waits(jobs, reqs, cards=2)
    assert waits["v100-50"] == [0, 0, 0]
    # the third half leaves at 50: two halves fill one card, the first whole takes the other (it waited
    # 49 s), the second whole takes it when the first leaves at 60
    assert waits["v100-100"] == [49, 58]
    jobs, reqs = jobs_of(("v100-100", 0, 100, 2), ("v100-25", 1, 10, 1), ("v100-100", 2, 10, 1))
    first = reference_waits(jobs, reqs, cards=2)
    assert first == {"v100-100x2": [0], "v100-25": [99], "v100-100": [98]}
    assert reference_waits(jobs, reqs, cards=2, wholes_after_s=0) == first  # nothing to reorder here


def test_whole_cards_first_lets_them_pass_waiting_slices() -> None:
    jobs, reqs = jobs_of(("v100-100", 0, 100, 1), ("v100-50", 1, 100, 1), ("v100-50", 2, 100, 1),
                         ("v100-100", 3, 10, 1))
    slices_first = reference_waits(jobs, reqs, cards=2)
    wholes_first = reference_waits(jobs, reqs, cards=2, wholes_after_s=0)
    assert slices_first["v100-100"] == [0, 97] and slices_first["v100-50"] == [0, 0]
    assert wholes_first["v100-100"] == [0, 97]  # the halves came first and fit: nobody waits for them


def test_a_job_that_never_fits_waits_for_ever_and_bad_input_is_refused() -> None:
    jobs, reqs = jobs_of(("v100-100", 0, 10, 4))
    assert reference_waits(jobs, reqs, cards=2) == {"v100-100x4": [math.inf]}
    with pytest.raises(ValueError):
        reference_waits(jobs, [], cards=2)
    for tau in (-1.0, math.nan):
        with pytest.raises(ValueError, match="wholes_after_s"):
            reference_waits(jobs, reqs, cards=2, wholes_after_s=tau)


# One card, busy with W0 until 100; W1 (20) and W2 (90) wait for it beside the half H1 (30). At 100:
#   τ = ∞ (slices first): H1 starts (waits 70); W1 at 110 when H1 leaves (90); W2 at 120 (30).
#   τ = 0 (wholes first): W1 at 100 (80), W2 at 110 (20), H1 at 120 (90).
#   τ = 50: W1 has waited 80 >= 50, so it goes first (80); at 110 W2 has waited 20 < 50, so H1 goes (80);
#   W2 at 120 (30).
AGING = (("v100-100", 0, 100, 1), ("v100-100", 20, 10, 1), ("v100-50", 30, 10, 1), ("v100-100", 90, 10, 1))


@pytest.mark.parametrize(("tau", "wholes", "halves"), [
    (math.inf, [0, 90, 30], [70]),
    (0.0, [0, 80, 20], [90]),
    (50.0, [0, 80, 30], [80]),
    (80.0, [0, 80, 30], [80]),  # waited exactly τ at 100: it goes first
    (81.0, [0, 90, 30], [70]),  # one second short of τ: as slices first
])
def test_a_whole_card_goes_ahead_of_slices_once_it_has_waited_tau(tau: float, wholes: list[float],
                                                                  halves: list[float]) -> None:
    jobs, reqs = jobs_of(*AGING)
    assert reference_waits(jobs, reqs, cards=1, wholes_after_s=tau) == {"v100-100": wholes, "v100-50": halves}


# The same case by arrival order, H1 counted h earlier (its key 30 - h against W1's 20 and W2's 90; ties: wholes):
#   h = 0 (first in, first out): W1 at 100 (80), H1 at 110 (80), W2 at 120 (30);
#   h = 11 (H1's key 19 < 20): slices first; h = -60 (H1's key 90, W2's too): wholes first.
@pytest.mark.parametrize(("head_start", "wholes", "halves"), [
    (math.inf, [0, 90, 30], [70]),
    (0.0, [0, 80, 30], [80]),
    (10.0, [0, 80, 30], [80]),  # a tie with W1: the whole card goes first
    (11.0, [0, 90, 30], [70]),
    (-55.0, [0, 80, 30], [80]),
    (-60.0, [0, 80, 20], [90]),
    (-math.inf, [0, 80, 20], [90]),
])
def test_by_arrival_with_a_head_start_for_slices(head_start: float, wholes: list[float], halves: list[float]) -> None:
    jobs, reqs = jobs_of(*AGING)
    assert reference_waits(jobs, reqs, cards=1, slice_head_start_s=head_start) == {"v100-100": wholes,
                                                                                   "v100-50": halves}


# One card, W0 until 100; W1 (20), a quarter Q (25) and a half H1 (30) wait, ten seconds each.
PER_PRODUCT = (("v100-100", 0, 100, 1), ("v100-100", 20, 10, 1), ("v100-25", 25, 10, 1), ("v100-50", 30, 10, 1))


@pytest.mark.parametrize(("head_start", "wholes", "quarters", "halves"), [
    (0.0, [0, 80], [85], [80]),  # first in, first out: W1 at 100, both slices at 110
    ({"v100-25": 0.0}, [0, 80], [85], [80]),  # a slice product not named: 0
    ({"v100-25": 10.0}, [0, 90], [75], [70]),  # Q counts from 15, before W1: Q, then H1 beside it, W1 at 110
    ({"v100-50": 5.0}, [0, 80], [85], [80]),  # H1 counts from 25, still after W1
    ({"v100-50": 15.0}, [0, 90], [75], [70]),  # H1 counts from 15: H1 first, Q fits beside it
])
def test_a_head_start_per_slice_product(head_start: float | dict[str, float], wholes: list[float],
                                        quarters: list[float], halves: list[float]) -> None:
    jobs, reqs = jobs_of(*PER_PRODUCT)
    assert reference_waits(jobs, reqs, cards=1, slice_head_start_s=head_start) == {
        "v100-100": wholes, "v100-25": quarters, "v100-50": halves}


def test_each_slice_product_has_its_own_line() -> None:
    # one card, 3/4 of it busy until 100: the half of 10 cannot start, the quarter of 20 can, beside it
    jobs, reqs = jobs_of(("v100-50", 0, 100, 1), ("v100-25", 0, 100, 1), ("v100-50", 10, 10, 1),
                         ("v100-25", 20, 10, 1))
    assert reference_waits(jobs, reqs, cards=1) == {"v100-50": [0, 90], "v100-25": [0, 0]}


def test_a_head_that_does_not_fit_blocks_its_own_line_only() -> None:
    # one card, half of it busy until 100: the whole card cannot start, the half behind it fits beside the first
    jobs, reqs = jobs_of(("v100-50", 0, 100, 1), ("v100-100", 1, 10, 1), ("v100-50", 2, 10, 1))
    for tau, head_start in ((0.0, math.inf), (math.inf, -math.inf), (math.inf, 0.0)):
        assert reference_waits(jobs, reqs, cards=1, wholes_after_s=tau, slice_head_start_s=head_start) == {
            "v100-50": [0, 0], "v100-100": [99]}
    for bad in (math.nan, {"v100-25": math.nan}):
        with pytest.raises(ValueError, match="slice_head_start_s"):
            reference_waits(jobs, reqs, cards=1, slice_head_start_s=bad)


def test_a_tau_longer_than_any_wait_is_slices_first() -> None:
    rng = random.Random(7)
    products = ("v100-25", "v100-50", "v100-100")
    jobs, reqs = jobs_of(*((rng.choice(products), rng.uniform(0, 500), rng.uniform(1, 60), 1) for _ in range(300)))
    slices_first = reference_waits(jobs, reqs, cards=3)
    longest = max(w for waits in slices_first.values() for w in waits)
    assert longest > 60  # a line formed: the order matters here
    assert reference_waits(jobs, reqs, cards=3, wholes_after_s=longest + 1) == slices_first
    assert reference_waits(jobs, reqs, cards=3, wholes_after_s=0) != slices_first


# product_waits: 4 cards; a 2-card job runs until 100, a 4-card job comes at 1, a whole card at 2 (for 200).
HOLD = (("v100-100", 0, 100, 2), ("v100-100", 1, 50, 4), ("v100-100", 2, 200, 1))


@pytest.mark.parametrize(("hold_after", "x4", "wholes"), [
    (math.inf, [201], [0]),  # backfill: the whole card starts beside the 2-card job; the 4-card job waits for both
    (50.0, [201], [0]),  # at 2 the 4-card head has waited 1 s, short of its hold
    (1.0, [99], [148]),  # waited 1 s at 2: it holds; it starts at 100, the whole card when it leaves at 150
    (0.0, [99], [148]),
])
def test_a_head_that_waited_its_hold_blocks_every_line_after_it(hold_after: float, x4: list[float],
                                                                wholes: list[float]) -> None:
    jobs, reqs = jobs_of(*HOLD)
    assert product_waits(jobs, reqs, cards=4, hold_after_s=hold_after) == {
        "v100-100x2": [0], "v100-100x4": x4, "v100-100": wholes}


# 2 cards, both busy until 100; a whole card W comes at 5 (for 50), a 2-card job D at 10 (for 30).
AHEAD = (("v100-100", 0, 100, 2), ("v100-100", 5, 50, 1), ("v100-100", 10, 30, 2))


@pytest.mark.parametrize(("ahead", "wholes", "x2"), [
    ({}, [95], [0, 140]),  # arrival order: W at 100, D once W leaves at 150
    ({"v100-100x2": 5.0}, [95], [0, 140]),  # D counts from 5, a tie with W: the earlier arrival goes first
    ({"v100-100x2": 6.0}, [125], [0, 90]),  # D counts from 4: D at 100, W when it leaves at 130
    ({"v100-100x2": math.inf}, [125], [0, 90]),
    ({"v100-100": -10.0}, [125], [0, 90]),  # W an instant behind D
])
def test_a_product_counted_earlier_goes_first(ahead: dict[str, float], wholes: list[float], x2: list[float]) -> None:
    jobs, reqs = jobs_of(*AHEAD)
    assert product_waits(jobs, reqs, cards=2, ahead_s=ahead) == {"v100-100x2": x2, "v100-100": wholes}


def test_alone_serves_each_whole_card_product_first_in_first_out_on_its_own() -> None:
    # 4 cards: 2-card jobs at 0, 1, 2 (the third waits for the first to leave at 100); quarters do not count
    jobs, reqs = jobs_of(("v100-100", 0, 100, 2), ("v100-25", 0, 500, 1), ("v100-100", 1, 100, 2),
                         ("v100-100", 2, 10, 2), ("v100-100", 3, 10, 1))
    assert alone_waits(jobs, reqs, cards=4) == {"v100-100x2": [0, 0, 98], "v100-100": [0]}
    with pytest.raises(ValueError):
        alone_waits(jobs, reqs[:2], cards=4)
    for bad in ({"hold_after_s": -1.0}, {"ahead_s": {"v100-100": math.nan}}):
        with pytest.raises(ValueError):
            product_waits(jobs, reqs, cards=4, **bad)


@pytest.mark.parametrize("seed", range(5))
def test_no_order_starts_a_whole_card_job_sooner_than_alone(seed: int) -> None:
    # the bound, job by job, under every order that serves each product first in, first out
    rng = random.Random(seed)
    spec = [(rng.choice(("v100-25", "v100-50", "v100-100")), rng.uniform(0, 400), rng.uniform(1, 80),
             rng.choice((1, 1, 2, 4))) for _ in range(200)]
    jobs, reqs = jobs_of(*((p, a, d, c if p == "v100-100" else 1) for p, a, d, c in spec))
    alone = alone_waits(jobs, reqs, cards=4)
    assert max(max(w) for w in alone.values()) > 0  # a product makes a line on its own: the bound bites
    orders = [product_waits(jobs, reqs, 4), product_waits(jobs, reqs, 4, {"v100-100x4": math.inf}, 0.0),
              product_waits(jobs, reqs, 4, {"v100-100": 120.0}, 30.0), reference_waits(jobs, reqs, 4)]
    for waits in orders:
        for product, floor in alone.items():
            assert all(w >= f for w, f in zip(waits[product], floor, strict=True)), product
