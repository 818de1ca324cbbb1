"""``fgd`` (baseline)'s table: −int(100·sigmoid((F_before − F_after)/1000)) of the node's best placement."""

from __future__ import annotations

import math

import pytest

from packing.fragment import TypicalPod
from packing.policies.fgd import fgd_score
from packing.products import load_catalog

from .policy_table import Case, Node, check

C = load_catalog()
H = C.request("v100-50")
# half the pods want a whole card, half a half card
MIX = (TypicalPod(0, 1000, 1, 0.5), TypicalPod(0, 500, 1, 0.5))


def test_fgd_score_is_an_integer_sigmoid() -> None:
    assert fgd_score(0) == 50 and fgd_score(250) == int(100 / (1 + math.exp(-0.25))) == 56
    assert fgd_score(-250) == 43 and fgd_score(-1e9) == 0


TABLE = [
    # a = (1000, 500 free): F before 250 (the 500 card is fragment for the whole-card pod); filling the
    # half-used card leaves (1000, 0): F 0, gain +250, score 56; breaking the empty one: F 500, gain −250.
    # b = (1000): F 0 before, 250 after: gain −250, score 43.
    Case("fill the half-used card, keep the empty one whole", {"a": Node((0, 500)), "b": Node((0,))}, H,
         {"a": (-56,), "b": (-43,)}, ("a", (1,)), MIX),
    Case("equal scores: FGD leaves the tie to the node order", {"a": Node((0,)), "b": Node((0,))}, H,
         {"a": (-43,), "b": (-43,)}, ("a", (0,)), MIX),
]


@pytest.mark.parametrize("case", TABLE, ids=lambda c: c.name)
def test_fgd_table(case: Case) -> None:
    check("fgd", case)
