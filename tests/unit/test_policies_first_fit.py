"""``first-fit``'s table: (0,) wherever the request fits; the node order, then the first fitting card."""

from __future__ import annotations

import pytest

from packing.products import load_catalog

from .policy_table import Case, Node, check

C = load_catalog()
Q, H = C.request("v100-25"), C.request("v100-50")

TABLE = [
    Case("the first node that fits", {"a": Node((1000,)), "b": Node((0, 0)), "c": Node((0,))}, Q,
         {"a": None, "b": (0,), "c": (0,)}, ("b", (0,))),
    Case("its first fitting card, not the tightest", {"a": Node((0, 750, 500))}, H, {"a": (0,)}, ("a", (0,))),
]


@pytest.mark.parametrize("case", TABLE, ids=lambda c: c.name)
def test_first_fit_table(case: Case) -> None:
    check("first-fit", case)
