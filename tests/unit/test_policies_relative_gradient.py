"""``relative-gradient``'s table: (−⌊gain / (0.12 · size)⌋, a slice on an untouched node, order); no GPU: best fit."""

from __future__ import annotations

import pytest

from packing.fragment import TypicalPod
from packing.policies.relative_gradient import relative_level
from packing.products import Request, load_catalog

from .policy_table import Case, Node, check

C = load_catalog()
H = C.request("v100-50")
MIX = (TypicalPod(0, 1000, 1, 0.5), TypicalPod(0, 500, 1, 0.5))
WHOLE_MIX = (TypicalPod(0, 1000, 1, 1.0),)
CPU_MIX = (TypicalPod(8000, 1000, 1, 1.0),)

TABLE = [
    # a: filling the half-used card leaves the empty one whole for both typical pods, gain +250 =
    # 4.2 steps of 60 milli; b: halving its only card strands it for the 1000-milli pod, gain −250
    Case("the relative level first", {"a": Node((0, 500)), "b": Node((0,))}, H,
         {"a": (-4, False, 0), "b": (5, True, 1)}, ("a", (1,)), MIX),
    # a quarter on an empty card strands its 750 milli for the whole-card pod on either node: gain −750, level −25
    Case("equal levels, a slice: a used node before an untouched one", {"a": Node((0,)), "b": Node((0, 0, 1000))},
         C.request("v100-25"), {"a": (25, True, 0), "b": (25, False, 1)}, ("b", (0,)), WHOLE_MIX),
    Case("equal levels, a whole card: the node order, used or not", {"a": Node((0, 0)), "b": Node((0, 0, 1000))},
         C.request("v100-100"), {"a": (0, False, 0), "b": (0, False, 1)}, ("a", (0,)), WHOLE_MIX),
    Case("the key is unique: equal nodes differ by order", {"a": Node((0,)), "b": Node((0,))}, H,
         {"a": (5, True, 0), "b": (5, True, 1)}, ("a", (0,)), MIX),
    # as in gradient-fit: the node with the least idle GPU, whatever FGD's level says
    Case("no GPU: the node with the least idle GPU, before the level",
         {"a": Node((1000, 0), cpu=10000), "b": Node((1000,), cpu=6000), "c": Node((0, 0), cpu=96000)},
         Request(0, count=0, cpu_milli=4000),
         {"a": (1000, -26, 0), "b": (0, -50, 1), "c": (2000, -50, 2)}, ("b", ()), CPU_MIX),
]


@pytest.mark.parametrize("case", TABLE, ids=lambda c: c.name)
def test_relative_gradient_table(case: Case) -> None:
    check("relative-gradient", case)


@pytest.mark.parametrize(("gain", "milli", "count", "level"), [
    (0.0, 250, 1, 0), (29.9, 250, 1, 0), (30.0, 250, 1, 1), (-0.1, 250, 1, -1),  # steps of 30 for a quarter
    (119.9, 1000, 1, 0), (120.0, 1000, 1, 1), (-960.0, 1000, 8, -1), (960.0, 1000, 8, 1),  # 120, and 960 for 8 cards
])
def test_a_level_is_twelve_percent_of_the_request(gain: float, milli: int, count: int, level: int) -> None:
    assert relative_level(gain, Request(milli, milli * 32, count)) == level
