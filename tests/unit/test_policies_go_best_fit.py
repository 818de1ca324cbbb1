"""``go-best-fit`` (baseline)'s table: −int(100·(1 − [0.5·(cpu_left − req)/128000 + 0.5·(gpu_left − req)/8000]))."""

from __future__ import annotations

import pytest

from packing.policies.go_best_fit import go_best_fit_score
from packing.products import load_catalog

from .policy_table import Case, Node, check

C = load_catalog()


def test_go_best_fit_score_is_the_artifacts_formula() -> None:
    # 1 − [0.5·(64000 − 8000)/128000 + 0.5·(3000 − 500)/8000] = 1 − (0.21875 + 0.15625) = 0.625
    assert go_best_fit_score(64000, 3000, 8000, 500) == 62
    assert go_best_fit_score(8000, 500, 8000, 500) == 100  # a perfect fit
    assert go_best_fit_score(128000, 8000, 0, 0) == 0


TABLE = [
    # 1 − [0.5·56000/128000 + 0.5·1750/8000] = 0.671875 → 67; 1 − [0 + 0.5·750/8000] = 0.953125 → 95
    Case("the snuggest node on CPU and idle GPU", {"a": Node((0, 0), cpu=64000), "b": Node((0,), cpu=8000)},
         C.request("v100-25", cpu_milli=8000), {"a": (-67,), "b": (-95,)}, ("b", (0,))),
]


@pytest.mark.parametrize("case", TABLE, ids=lambda c: c.name)
def test_go_best_fit_table(case: Case) -> None:
    check("go-best-fit", case)
