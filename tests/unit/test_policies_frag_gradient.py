"""``frag-gradient``'s table: (−FGD level, idle GPU if no GPU asked, all cards empty, node order)."""

from __future__ import annotations

import pytest

from packing.fragment import TypicalPod
from packing.products import Request, load_catalog

from .policy_table import Case, Node, check

C = load_catalog()
H = C.request("v100-50")
MIX = (TypicalPod(0, 1000, 1, 0.5), TypicalPod(0, 500, 1, 0.5))

TABLE = [
    Case("FGD's level first", {"a": Node((0, 500)), "b": Node((0,))}, H,
         {"a": (-56, 0, False, 0), "b": (-43, 0, True, 1)}, ("a", (1,)), MIX),
    Case("equal levels: a used node before an untouched one", {"a": Node((0,)), "b": Node((0, 0, 1000))}, H,
         {"a": (-43, 0, True, 0), "b": (-43, 0, False, 1)}, ("b", (0,)), MIX),
    Case("the key is unique: equal nodes differ by order", {"a": Node((0,)), "b": Node((0,))}, H,
         {"a": (-43, 0, True, 0), "b": (-43, 0, True, 1)}, ("a", (0,)), MIX),
    # no GPU asked, no CPU tracked: the gain is 0 everywhere (level 50), the least idle GPU decides
    Case("no GPU: the least idle GPU among the best level", {"a": Node((1000, 0)), "b": Node((1000,))},
         Request(0, count=0), {"a": (-50, 1000, False, 0), "b": (-50, 0, False, 1)}, ("b", ()), MIX),
]


@pytest.mark.parametrize("case", TABLE, ids=lambda c: c.name)
def test_frag_gradient_table(case: Case) -> None:
    check("frag-gradient", case)
