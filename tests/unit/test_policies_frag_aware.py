"""``frag-aware``'s table: (0, tightest leftover on a partly used card, free) before (1, best fit's key)."""

from __future__ import annotations

import pytest

from packing.products import load_catalog

from .policy_table import Case, Node, check

C = load_catalog()
Q, H, W = C.request("v100-25"), C.request("v100-50"), C.request("v100-100")

TABLE = [
    Case("a partly used card before an empty one", {"a": Node((500, 0)), "b": Node((0, 0))}, Q,
         {"a": (0, 250, 1500), "b": (1, 750, 2000)}, ("a", (0,))),
    Case("no partly used card fits: break an empty one", {"a": Node((750, 0)), "b": Node((0, 0, 0))}, H,
         {"a": (1, 500, 1250), "b": (1, 500, 3000)}, ("a", (1,))),
    Case("whole cards keep best fit's key", {"a": Node((0, 0)), "b": Node((0, 250))}, W,
         {"a": (2, 2000), "b": (1, 1750)}, ("b", (0,))),
]


@pytest.mark.parametrize("case", TABLE, ids=lambda c: c.name)
def test_frag_aware_table(case: Case) -> None:
    check("frag-aware", case)
