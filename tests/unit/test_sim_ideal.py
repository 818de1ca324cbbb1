"""``simulations.ideal``: the no-fragmentation reference the fairness table sets whole-card tails against."""

from __future__ import annotations

import math

import pytest

from packing.products import Request, load_catalog
from simulations.ideal import reference_waits
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
    assert reference_waits(jobs, reqs, cards=2, wholes_first=True) == first  # nothing to reorder here


def test_whole_cards_first_lets_them_pass_waiting_slices() -> None:
    jobs, reqs = jobs_of(("v100-100", 0, 100, 1), ("v100-50", 1, 100, 1), ("v100-50", 2, 100, 1),
                         ("v100-100", 3, 10, 1))
    slices_first = reference_waits(jobs, reqs, cards=2)
    wholes_first = reference_waits(jobs, reqs, cards=2, wholes_first=True)
    assert slices_first["v100-100"] == [0, 97] and slices_first["v100-50"] == [0, 0]
    assert wholes_first["v100-100"] == [0, 97]  # the halves came first and fit: nobody waits for them


def test_a_job_that_never_fits_waits_for_ever_and_bad_input_is_refused() -> None:
    jobs, reqs = jobs_of(("v100-100", 0, 10, 4))
    assert reference_waits(jobs, reqs, cards=2) == {"v100-100x4": [math.inf]}
    with pytest.raises(ValueError):
        reference_waits(jobs, [], cards=2)
