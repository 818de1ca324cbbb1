"""``random`` (baseline): a uniform draw among the fitting nodes, reproducible from its seed."""

from __future__ import annotations

from collections import Counter

from packing.policies import policy_for
from packing.products import load_catalog

from .policy_table import Node, ledger_of

C = load_catalog()
H = C.request("v100-50")
NODES = {"a": Node((1000,)), "b": Node((0,)), "c": Node((500,)), "d": Node((750,))}


def test_random_fit_draws_only_fitting_nodes_about_evenly() -> None:
    ledger = ledger_of(NODES)
    policy = policy_for("random", seed=3)
    drawn = Counter(policy.choose(ledger, H).node for _ in range(3000))  # type: ignore[union-attr]
    assert set(drawn) == {"b", "c"}  # a and d have no 500 milli free
    assert abs(drawn["b"] - drawn["c"]) < 300  # 1500 each, give or take five standard deviations


def test_random_fit_is_reproducible_from_its_seed() -> None:
    ledger = ledger_of(NODES)
    runs = [[p.choose(ledger, H).node for _ in range(20)]  # type: ignore[union-attr]
            for p in (policy_for("random", seed=9), policy_for("random", seed=9))]
    assert runs[0] == runs[1]
    assert policy_for("random").capabilities.sampled
