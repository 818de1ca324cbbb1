"""The fairness bench's frontier over the no-fragmentation reference: which τ it picks, and reading best effort."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from simulations import fairness
from tests.bench.bench_fairness import (
    best_point,
    frontier_orders,
    head_starts,
    order_label,
    read_best_effort,
    sacrificed,
)

MIN = 60.0
BEST_EFFORT = {"v100-25": 4 * MIN, "v100-50": 20 * MIN, "v100-100": 60 * MIN}  # limits 10, 30, 80 min


def test_a_product_above_its_limit_is_sacrificed() -> None:
    assert fairness.limit_s(20 * MIN) == 30 * MIN
    row = {"v100-25": 10 * MIN, "v100-50": 30.1 * MIN, "v100-100": 90 * MIN}
    assert sacrificed(row, BEST_EFFORT) == ["v100-50", "v100-100"]
    assert sacrificed({"v100-25": 10 * MIN, "v100-100x2": 999 * MIN}, BEST_EFFORT) == []  # no reference: not judged


def test_the_best_point_is_the_smallest_worst_p99_with_no_product_sacrificed() -> None:
    inf = math.inf
    rows = {
        (0.0, inf, inf): {"v100-25": 40 * MIN, "v100-50": 45 * MIN, "v100-100": 35 * MIN},  # halves sacrificed
        (600.0, inf, inf): {"v100-25": 9 * MIN, "v100-50": 29 * MIN, "v100-100": 44 * MIN},  # the best fair point
        (inf, inf, inf): {"v100-25": 1 * MIN, "v100-50": 2 * MIN, "v100-100": 55 * MIN},
        (inf, 0.0, 0.0): {"v100-25": 3 * MIN, "v100-50": 10 * MIN, "v100-100": 50 * MIN},
    }
    best = best_point(rows, BEST_EFFORT)
    assert best is not None
    assert (best.order, best.worst_product, best.worst_p99_s) == ((600.0, inf, inf), "v100-100", 44 * MIN)
    assert math.isclose(best.ratio, 44 / 60)
    tie = {(inf, -900.0, -900.0): {"v100-25": 2 * MIN, "v100-50": 5 * MIN, "v100-100": 44 * MIN}, **rows}
    tied = best_point(tie, BEST_EFFORT)
    assert tied is not None and tied.order == (inf, -900.0, -900.0)  # a tie: the first listed
    assert best_point({(0.0, inf, inf): rows[(0.0, inf, inf)]}, BEST_EFFORT) is None


def test_the_orders_and_their_labels() -> None:
    inf = math.inf
    orders = frontier_orders([0, 30], [inf, 0, -15, -inf])
    assert orders == [(0.0, inf, inf), (1800.0, inf, inf), (inf, inf, inf), (inf, 0.0, 0.0), (inf, -900.0, -900.0),
                      (inf, -inf, -inf)]
    assert [order_label(o) for o in orders] == ["τ 0", "τ 30", "h ∞", "h 0", "h -15", "h -∞"]
    assert frontier_orders([30], [0, 15], cross=True) == [(1800.0, 0.0, 0.0), (1800.0, 900.0, 900.0)]
    assert order_label((1800.0, 900.0, 900.0)) == "τ 30 h 15"
    split = frontier_orders([30], [inf, 0], per_product=True)
    assert split == [(inf, inf, inf), (inf, inf, 0.0), (inf, 0.0, inf), (inf, 0.0, 0.0)]
    assert [order_label(o) for o in split] == ["h ∞", "h ∞/0", "h 0/∞", "h 0"]
    assert [head_starts(o) for o in split] == [inf, {"v100-25": inf, "v100-50": 0.0},
                                               {"v100-25": 0.0, "v100-50": inf}, 0.0]
    with pytest.raises(ValueError, match="choose one"):
        frontier_orders([30], [0], cross=True, per_product=True)


def test_best_effort_is_read_per_mix_and_load_from_simulate_json(tmp_path: Path) -> None:
    def block(mix: str, rho: float, halves_s: float) -> dict[str, object]:
        return {"workload": f"openb_pod_list_{mix}.csv, jobs of <= 1 card(s) (74 larger dropped)", "rho_target": rho,
                "seeds": [1, 2], "runs": [
                    {"admission": "worst-first", "waits": {"v100-50": {"p99_s": 1.0}}, "per_seed_p99": {}},
                    {"admission": fairness.REFERENCE, "waits": {"all": {"p99_s": 9.0}, "v100-50": {"p99_s": 7.0}},
                     "per_seed_p99": {"v100-50": {"mean": halves_s}}}]}

    sweep = tmp_path / "sweep.json"
    sweep.write_text(json.dumps({"protocol": "b", "sweep": [block("default", 0.85, 30.0),
                                                            block("gpushare60", 0.95, 40.0)]}))
    one = tmp_path / "one.json"
    one.write_text(json.dumps(block("gpushare100", 0.7, 50.0)))
    assert read_best_effort(sweep) == {("default", 0.85): ((1, 2), {"v100-50": 30.0}),
                                       ("gpushare60", 0.95): ((1, 2), {"v100-50": 40.0})}
    assert read_best_effort(one) == {("gpushare100", 0.7): ((1, 2), {"v100-50": 50.0})}
