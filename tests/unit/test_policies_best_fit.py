"""``best-fit``'s table: (smallest leftover on a fitting card, node's free milli); k cards: (empty cards, free)."""

from __future__ import annotations

import pytest

from packing.products import Request, load_catalog

from .policy_table import Case, Node, check

C = load_catalog()
Q, W = C.request("v100-25"), C.request("v100-100")

TABLE = [
    Case("the tightest card wins", {"a": Node((500, 0)), "b": Node((750, 1000))}, Q,
         {"a": (250, 1500), "b": (0, 250)}, ("b", (0,))),
    Case("equal leftovers: the fuller node", {"a": Node((500, 500)), "b": Node((500, 1000, 1000))}, Q,
         {"a": (250, 1000), "b": (250, 500)}, ("b", (0,))),
    Case("k whole cards: the fewest empty cards that hold k", {"a": Node((0, 0, 0, 0)), "b": Node((0, 0, 250)),
                                                               "c": Node((0, 500))},
         C.request("v100-100", 2), {"a": (4, 4000), "b": (2, 2750), "c": None}, ("b", (0, 1))),
    Case("no GPU: the node with the least idle GPU", {"a": Node((0, 0)), "b": Node((1000,))}, Request(0, count=0),
         {"a": (0, 2000), "b": (0, 0)}, ("b", ())),
    Case("CPU too short: no key", {"a": Node((0,), cpu=500), "b": Node((0,))},
         C.request("v100-25", cpu_milli=1000), {"a": None, "b": (750, 1000)}, ("b", (0,))),
    Case("fits nowhere", {"a": Node((1000,)), "b": Node((500,))}, W, {"a": None, "b": None}, None),
]


@pytest.mark.parametrize("case", TABLE, ids=lambda c: c.name)
def test_best_fit_table(case: Case) -> None:
    check("best-fit", case)
