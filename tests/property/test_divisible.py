"""The divisible-sizes theorem (notes/packing-and-queueing.md, section 4), checked on the real packer.

With arrivals only and sizes 1/4, 1/2 and 1 of a card, best fit and first fit never reject a
slice while the cluster's total free capacity is at least its size. Worst fit ("spread") does,
and a single departure is enough to strand a whole card under both best and first fit.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from packing.ledger import Ledger, NoFit
from packing.policies import BEST_FIT, FIRST_FIT, FRAG_AWARE, SPREAD, Policy, place
from packing.products import Catalog, Request, load_catalog

CATALOG: Catalog = load_catalog()
V100 = "Tesla-V100-SXM2-32GB"
SLICES = {p.milli: CATALOG.request(p.name) for p in CATALOG.products}  # 250, 500, 1000
PACKING_POLICIES = [BEST_FIT, FIRST_FIT, FRAG_AWARE]  # frag-aware is best fit with a preference on top


def cluster(shape: Sequence[int]) -> Ledger:
    """Nodes n0, n1, ... with ``shape[i]`` V100 cards each, CPU and RAM untracked."""
    ledger = Ledger()
    for i, cards in enumerate(shape):
        ledger.add_node(f"n{i}", [(f"n{i}-g{j}", V100, 32768) for j in range(cards)])
    return ledger


def strands(ledger: Ledger, request: Request, policy: Policy, claim: str) -> bool | None:
    """Place ``request``: None when placed, else whether the refusal strands free capacity."""
    try:
        place(ledger, claim, request, policy)
    except NoFit:
        return ledger.free_milli() >= request.milli
    return None


def violations(policy: Policy, shape: Sequence[int], sizes: Sequence[Request], depth: int
               ) -> Iterator[tuple[list[int], bool]]:
    """Every arrival sequence up to ``depth`` long, depth first; yields (sequence, stranded) per refusal.

    Walks the tree of sequences on one ledger: place, recurse, release, which also leans on
    ``release(place(x))`` restoring the ledger exactly.
    """
    ledger = cluster(shape)
    path: list[int] = []

    def walk() -> Iterator[tuple[list[int], bool]]:
        if len(path) == depth:
            return
        for request in sizes:
            claim = f"c{len(path)}"
            before = ledger.fingerprint()
            stranded = strands(ledger, request, policy, claim)
            if stranded is not None:
                yield [*path, request.milli], stranded
                continue
            path.append(request.milli)
            yield from walk()
            path.pop()
            ledger.release(claim)
            assert ledger.fingerprint() == before

    yield from walk()


# ---- arrivals only: best fit and first fit never strand ---------------------------------------

SHAPES = [(1,), (2,), (1, 1), (3,), (2, 1), (1, 1, 1), (4,), (2, 2)]


@pytest.mark.parametrize("policy", PACKING_POLICIES, ids=lambda p: p.name)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_every_short_sequence_packs_without_stranding(policy: Policy, shape: tuple[int, ...]) -> None:
    depth = 7 if sum(shape) <= 3 else 6
    refusals = list(violations(policy, shape, list(SLICES.values()), depth))
    assert refusals, "the enumeration must reach full clusters, or it proves nothing"
    stranded = [seq for seq, bad in refusals if bad]
    assert stranded == [], f"{policy.name} refused {stranded[0]} on {shape} with enough capacity free"


@st.composite
def arrivals(draw: st.DrawFn) -> tuple[list[int], list[int]]:
    shape = draw(st.lists(st.integers(1, 4), min_size=1, max_size=6) | st.lists(st.just(1), min_size=1, max_size=6))
    # enough slices to overfill the cluster: every run ends with refusals to judge
    sizes = draw(st.lists(st.sampled_from(sorted(SLICES)), min_size=1, max_size=4 * sum(shape) + 4))
    return shape, sizes


@pytest.mark.parametrize("policy", PACKING_POLICIES, ids=lambda p: p.name)
@given(case=arrivals())
@settings(max_examples=150)
def test_arrivals_never_strand_capacity(policy: Policy, case: tuple[list[int], list[int]]) -> None:
    shape, sizes = case
    ledger = cluster(shape)
    for i, milli in enumerate(sizes):
        stranded = strands(ledger, SLICES[milli], policy, f"c{i}")
        if stranded is not None:
            event("refused")
            assert not stranded, f"refused {milli} milli with {ledger.free_milli()} free"
    ledger.verify()


# ---- worst fit is the counter-example -----------------------------------------------------------


def test_spread_strands_a_whole_card_by_hand() -> None:
    ledger = cluster([2])
    assert place(ledger, "a", SLICES[250], SPREAD).gpus == ("n0-g0",)
    assert place(ledger, "b", SLICES[250], SPREAD).gpus == ("n0-g1",)  # worst fit: the emptier card
    assert strands(ledger, SLICES[1000], SPREAD, "c") is True
    assert ledger.free_milli() == 1500


def shortest_violation(policy: Policy, shape: Sequence[int], sizes: Sequence[Request], depth: int) -> list[int] | None:
    return min((seq for seq, bad in violations(policy, shape, sizes, depth) if bad), key=len, default=None)


def test_search_finds_spread_violating_the_theorem() -> None:
    sizes = list(SLICES.values())
    assert shortest_violation(SPREAD, (2,), sizes, 5) == [250, 250, 1000]
    assert shortest_violation(SPREAD, (1, 1), sizes, 5) == [250, 250, 1000]
    assert shortest_violation(SPREAD, (3,), sizes, 5) == [250, 250, 250, 1000]


def test_non_dyadic_sizes_lose_the_guarantee() -> None:
    # the control case: why the catalog refuses 1/3 or 3/8 slices
    sizes = [Request(milli) for milli in (375, 625)]
    assert shortest_violation(BEST_FIT, (2,), sizes, 5) == [625, 625, 625]  # 750 free, in two 375 pieces


# ---- departures strand capacity even under best fit and first fit --------------------------------


@pytest.mark.parametrize("policy", [BEST_FIT, FIRST_FIT], ids=lambda p: p.name)
def test_five_events_strand_a_card(policy: Policy) -> None:
    ledger = cluster([2])
    assert place(ledger, "quarter", SLICES[250], policy).gpus == ("n0-g0",)
    assert place(ledger, "half-a", SLICES[500], policy).gpus == ("n0-g0",)
    assert place(ledger, "half-b", SLICES[500], policy).gpus == ("n0-g1",)
    ledger.release("quarter")
    assert ledger.free_milli() == 1000  # 1/2 + 1/2 free ...
    with pytest.raises(NoFit) as err:
        place(ledger, "whole", SLICES[1000], policy)  # ... yet no card is whole
    assert err.value.misfits["n0"].code == "NotEnoughWholeGPUs"
    assert err.value.misfits["n0"].resolvable
