"""``spread``'s table: (−(largest fitting free − milli), −node's free milli); the loosest card."""

from __future__ import annotations

import pytest

from packing.products import Request, load_catalog

from .policy_table import Case, Node, check

C = load_catalog()
Q = C.request("v100-25")

TABLE = [
    Case("the loosest card, the emptiest node", {"a": Node((500, 0)), "b": Node((750,))}, Q,
         {"a": (-750, -1500), "b": (0, -250)}, ("a", (1,))),
    Case("no GPU: the node with the most idle GPU", {"a": Node((0, 0)), "b": Node((1000,))}, Request(0, count=0),
         {"a": (0, -2000), "b": (0, 0)}, ("a", ())),
]


@pytest.mark.parametrize("case", TABLE, ids=lambda c: c.name)
def test_spread_table(case: Case) -> None:
    check("spread", case)
