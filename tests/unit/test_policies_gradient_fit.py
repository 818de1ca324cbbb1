"""``gradient-fit`` (the default)'s table. While the cluster fills: a slice (−⌊gain / (16 % of its milli)⌋, all
cards empty, order); whole cards (−FGD's level, all cards empty, order); no GPU: (idle GPU, −level, order);
relative-gradient's key while the typical pods name several models. Once it churns: (best-fit's key, order) and
best fit's tightest card."""

from __future__ import annotations

import pytest

from packing.fragment import TypicalPod
from packing.products import Request, load_catalog

from .policy_table import Case, Node, check

C = load_catalog()
H = C.request("v100-50")
MIX = (TypicalPod(0, 1000, 1, 0.5), TypicalPod(0, 500, 1, 0.5))
# a CPU-hungry typical pod: a node left with less than 8 cores strands its idle cards for it
CPU_MIX = (TypicalPod(8000, 1000, 1, 1.0),)
V100_ANY = "Tesla-V100-*-32GB"  # the catalog's pattern: every claim of a V100-only cluster names it
# the same shapes, one of them pinned to a model: the mix now names two patterns
MIXED = (TypicalPod(0, 1000, 1, 0.5), TypicalPod(0, 500, 1, 0.5, model=V100_ANY))
WHOLE_MIXED = (TypicalPod(0, 1000, 1, 0.5), TypicalPod(0, 1000, 1, 0.5, model=V100_ANY))

# placing half a card: on 750 milli free, gain 0.6·500 − 0.2·250 = 250; on 500 free, 0.6·500 = 300
SLICE_MIX = (TypicalPod(0, 1000, 1, 0.6), TypicalPod(0, 500, 1, 0.2), TypicalPod(0, 250, 1, 0.2))

TABLE = [
    # gains +250 and −250 for the 500 milli asked, in steps of 80 milli: levels 3 and −4
    Case("a slice: the gradient's level first", {"a": Node((0, 500)), "b": Node((0,))}, H,
         {"a": (-3, False, 0), "b": (4, True, 1)}, ("a", (1,)), MIX),
    # FGD's levels would tell them apart (56 and 57) and take b
    Case("a slice: gains within one step of 16 % of its size tie, the order decides",
         {"a": Node((250,)), "b": Node((500,))}, H, {"a": (-3, False, 0), "b": (-3, False, 1)}, ("a", (0,)),
         SLICE_MIX),
    Case("equal levels: a used node before an untouched one", {"a": Node((0,)), "b": Node((0, 0, 1000))}, H,
         {"a": (4, True, 0), "b": (4, False, 1)}, ("b", (0,)), MIX),
    # a's second card is withdrawn: a is a one-card node, as b is; counted as idle, it would make a
    # look able to host the two-card pod, and breaking that would cost the whole node (level 14)
    Case("a withdrawn card is no capacity", {"a": Node((0, 0), withdrawn=(1,)), "b": Node((0,))},
         C.request("v100-25"), {"a": (-6, True, 0), "b": (-6, True, 1)}, ("a", (0,)),
         (TypicalPod(0, 1000, 2, 1.0),)),
    Case("the key is unique: equal nodes differ by order", {"a": Node((0,)), "b": Node((0,))}, H,
         {"a": (4, True, 0), "b": (4, True, 1)}, ("a", (0,)), MIX),
    # 4 cores asked: on a (10 cores, an idle card) the card is then stranded for the 8-core pod, gain
    # −1000, level 26; b has no idle card, its CPU strands nothing: the least idle GPU comes first anyway
    Case("no GPU: the node with the least idle GPU, before the level",
         {"a": Node((1000, 0), cpu=10000), "b": Node((1000,), cpu=6000), "c": Node((0, 0), cpu=96000)},
         Request(0, count=0, cpu_milli=4000),
         {"a": (1000, -26, 0), "b": (0, -50, 1), "c": (2000, -50, 2)}, ("b", ()), CPU_MIX),
    Case("one model pattern for all (the catalog's): a slice's own levels", {"a": Node((0, 500)), "b": Node((0,))},
         H, {"a": (-3, False, 0), "b": (4, True, 1)}, ("a", (1,)),
         tuple(TypicalPod(p.cpu_milli, p.milli, p.count, p.weight, model=V100_ANY) for p in MIX)),
    # gains ±250 as in the first case, now in steps of 12 % of the 500 milli asked: +4.2 and −4.2 steps
    Case("several model patterns: relative levels", {"a": Node((0, 500)), "b": Node((0,))}, H,
         {"a": (-4, False, 0), "b": (5, True, 1)}, ("a", (1,)), MIXED),
    Case("several model patterns: a whole card follows the node order, used or not",
         {"a": Node((0, 0)), "b": Node((0, 0, 1000))}, C.request("v100-100"),
         {"a": (0, False, 0), "b": (0, False, 1)}, ("a", (0,)), WHOLE_MIXED),
    Case("one model pattern: a whole card goes to the used node", {"a": Node((0, 0)), "b": Node((0, 0, 1000))},
         C.request("v100-100"), {"a": (-50, True, 0), "b": (-50, False, 1)}, ("b", (0,)),
         (TypicalPod(0, 1000, 1, 1.0),)),
    # the "used node first" case above, churning: best fit's (leftover on the tightest card, free GPU, order)
    Case("churning: a slice takes best fit's key", {"a": Node((0,)), "b": Node((0, 0, 1000))}, H,
         {"a": (500, 1000, 0), "b": (500, 2000, 1)}, ("a", (0,)), MIX, churning=True),
    # filling, FGD's pick takes card 0: either card leaves room the typical half-card pod can use (gain 0
    # both), the first in card order wins; best fit takes the card with 500 free
    Case("churning: the pick is best fit's tightest card", {"a": Node((0, 500))}, H,
         {"a": (0, 1500, 0)}, ("a", (1,)), (TypicalPod(0, 500, 1, 1.0),), churning=True),
    # the "whole card goes to the used node" case above, churning: (empty cards, free GPU, order)
    Case("churning: a whole card takes best fit's key", {"a": Node((0, 0)), "b": Node((0, 0, 1000))},
         C.request("v100-100"), {"a": (2, 2000, 0), "b": (2, 2000, 1)}, ("a", (0,)),
         (TypicalPod(0, 1000, 1, 1.0),), churning=True),
    Case("churning: no GPU, best fit's (0, idle GPU, order)",
         {"a": Node((1000, 0), cpu=10000), "b": Node((1000,), cpu=6000)}, Request(0, count=0, cpu_milli=4000),
         {"a": (0, 1000, 0), "b": (0, 0, 1)}, ("b", ()), CPU_MIX, churning=True),
]


@pytest.mark.parametrize("case", TABLE, ids=lambda c: c.name)
def test_gradient_fit_table(case: Case) -> None:
    check("gradient-fit", case)
