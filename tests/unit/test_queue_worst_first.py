"""``worst-first`` (``packing.admission.worst_first``, the default): the longest-waiting claims first,
whatever their product; the front's targets held, the others steering; a claim of several cards gets a
target only past its hold clock."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from packing.admission import WorstFirst
from packing.admission.holds import is_hold
from packing.admission.worst_first import (
    DEFAULT_SETTINGS,
    FRONT_SHARE,
    HOLD_IDLE,
    HOLD_WITHIN,
    MAX_CLOCK,
    SPARE_WINDOW,
    HoldClock,
    WorstFirstSettings,
)
from packing.ledger import Ledger
from packing.node_fit import NodeConstraints
from packing.queue import (
    BLOCKED_BY_HEAD_OF_LINE,
    DEFAULT_ADMISSION,
    NO_CAPACITY,
    WAITING_FOR_RESERVATION,
    WORST_FIRST,
    ClaimQueue,
)
from packing.wait_history import WaitHistory
from tests.unit.queue_helpers import V100, W2, H, Q, W, by_claim, checked, claim, ledger_with, reasons


def wf_queue(ledger: Ledger, **kwargs: object) -> ClaimQueue:
    return ClaimQueue(ledger, admission=WORST_FIRST, **kwargs)  # type: ignore[arg-type]


def run(q: ClaimQueue, ledger: Ledger, name: str, request: object, node: str, gpu: int,
        limit: float | None = None, at: float = 0.0) -> None:
    """``name`` already holds ``request`` on GPU ``gpu`` of ``node`` since ``at``."""
    ledger.assign(name, request, node, (f"{node}-gpu{gpu}",))  # type: ignore[arg-type]
    q.start(name, "filler", request, now=at, time_limit=limit)  # type: ignore[arg-type]


def a_quarter_free_on_each(q: ClaimQueue, ledger: Ledger, limits: bool = False) -> None:
    """A half and a quarter already run on each GPU of n0 and n1 (4 each): a quarter free on each. With ``limits``
    they declare 1000 + 100 g and 500 + 100 g seconds, g the GPU's index."""
    for node in ("n0", "n1"):
        for g in range(4):
            run(q, ledger, f"{node}-{g}a", H, node, g, limit=1000.0 + 100 * g if limits else None)
            run(q, ledger, f"{node}-{g}b", Q, node, g, limit=500.0 + 100 * g if limits else None)


def strategy(q: ClaimQueue) -> WorstFirst:
    assert isinstance(q.strategy, WorstFirst)
    return q.strategy


def gpus_of(q: ClaimQueue) -> dict[str, tuple[str, ...]]:
    return {c: t.gpus for c, t in strategy(q).gpu_targets().items()}


def no_holds_left(ledger: Ledger) -> None:
    assert not [a for a in ledger.allocations if is_hold(a)], "a hold outlived its step"
    ledger.verify()


def test_it_is_the_default_and_every_product_is_in_line_at_once() -> None:
    q = ClaimQueue(ledger_with(1))
    assert DEFAULT_ADMISSION == WORST_FIRST == q.admission and strategy(q).clock.hold_within == HOLD_WITHIN == 1.0
    for r in (Q, H, W, W2):
        assert q.age_limit(r.product or "", r) == 0.0
    assert strategy(q).cap(ledger_with(64)) == 16 and strategy(q).cap(ledger_with(2)) == 1  # one GPU in four
    assert strategy(q).clock.front_share == FRONT_SHARE == 8  # of which the front's shape holds one in eight
    assert strategy(q).clock.hold_idle == HOLD_IDLE == 2.0  # a multi-card hold idles about 2 x H at most


def test_the_longest_waiting_claim_is_the_front_whatever_its_product() -> None:
    ledger = ledger_with(2)
    q = wf_queue(ledger)
    run(q, ledger, "q-long", Q, "n0", 0, limit=1000.0)
    run(q, ledger, "h-long", H, "n0", 0, limit=1000.0)
    run(q, ledger, "w-short", W, "n0", 1, limit=300.0)
    q.arrive(claim("old-half", H, at=0))  # a half first, then a whole card: neither fits
    q.arrive(claim("young-whole", W, at=10))
    assert q.admit(20) == []
    assert strategy(q).front() == "old-half"  # the half waited longest: it is held for, not the whole card
    why = by_claim(q, 20)
    assert why["old-half"].reason == WAITING_FOR_RESERVATION
    assert "the longest-waiting claim (waited 20 s): holding GPU 1 of node n0 for it" in why["old-half"].message
    assert why["young-whole"].reason == NO_CAPACITY  # the cap (one GPU of two) leaves it no target
    assert "drain targets go to the longest-waiting claims (1 longer-waiting claims have them)" in \
        why["young-whole"].message
    q.depart("w-short", 300)
    assert [(a.claim, a.allocation.gpus) for a in q.admit(300)] == [("old-half", ("n0-gpu1",))]
    no_holds_left(ledger)
    checked(q)


def two_wholes_and_a_half_waiting(front_share: int | None = None, worst: bool = False,
                                  lately: dict[str, float] | None = None, single: str | None = None,
                                  limits: bool = True) -> tuple[ClaimQueue, Ledger]:
    """8 GPUs with a quarter free on each; whole cards w0, w1 and a half wait (none fits), one step at 5 s.
    ``lately``: each product's recent p99 wait, recorded before the step; ``single``: ``single=`` (own, sure or
    share; nothing given: every default); ``limits``: the running claims declare their runtimes."""
    ledger = ledger_with(4, 4)
    settings = WorstFirstSettings(front_share=front_share or FRONT_SHARE, front_worst=worst,
                                  single_front=single or DEFAULT_SETTINGS.single_front)
    given = front_share or worst or single is not None
    q = wf_queue(ledger, max_drain_targets=4, worst_first=settings if given else None)
    for product, tail in (lately or {}).items():
        for i in range(100):
            q.view(0.0).book.waits.add(product, tail if i < 2 else 0.0)  # the two longest of 100: the p99
    a_quarter_free_on_each(q, ledger, limits=limits)
    q.arrive(claim("w0", W, at=0))
    q.arrive(claim("w1", W, at=1))
    q.arrive(claim("half", H, at=2))
    assert q.admit(5) == []
    return q, ledger


def test_targets_of_other_shapes_than_the_fronts_steer_new_work_away_but_do_not_hold() -> None:
    q, ledger = two_wholes_and_a_half_waiting(front_share=4, single="share")  # its shape may hold 2 of 8
    targets = gpus_of(q)
    assert set(targets) == {"w0", "w1", "half"} and strategy(q).front() == "w0"
    on_targets = {u for gpus in targets.values() for u in gpus}
    why = by_claim(q, 5)
    # the front's shape (whole cards) is held for, one target per head; the half's target steers
    assert why["w0"].reason == why["w1"].reason == WAITING_FOR_RESERVATION
    assert why["half"].reason == NO_CAPACITY and "new work is kept off GPU" in why["half"].message
    # a quarter fits on every GPU: it goes off the targets
    q.arrive(claim("quarter", Q, at=6))
    [a] = q.admit(6)
    assert a.claim == "quarter" and not set(a.allocation.gpus) & on_targets
    # with every GPU off the targets full, the next quarter takes the half's target, never a whole card's
    for u, g in ledger.gpus.items():
        if u not in on_targets and g.free_milli:
            ledger.assign(f"fill-{u}", Q, g.node, (u,))
    q.arrive(claim("late", Q, at=7))
    [b] = q.admit(7)
    assert b.claim == "late" and b.allocation.gpus == targets["half"]
    no_holds_left(ledger)


def test_the_fronts_shape_holds_one_gpu_in_front_share_while_the_other_shapes_still_steer() -> None:
    """The what-if ``single=share``: a front of one GPU's shape holds one GPU in ``front`` (1 of these 8)."""
    q, ledger = two_wholes_and_a_half_waiting(single="share")  # FRONT_SHARE 8: its shape holds 1 of the 8 GPUs
    targets = gpus_of(q)
    assert set(targets) == {"w0", "half"} and strategy(q).front() == "w0"  # w1 is past the front's share
    why = by_claim(q, 5)
    assert why["w0"].reason == WAITING_FOR_RESERVATION
    assert why["half"].reason == NO_CAPACITY and "new work is kept off GPU" in why["half"].message
    assert why["w1"].reason == NO_CAPACITY
    assert why["w1"].message.endswith("the drain targets of claims asking for the same GPUs, one GPU in 8 at most, "
                                      "go to longer-waiting ones")
    # the front still goes first: its target frees before the half's (limits 1000 + 100 g, the least first)
    node, g = targets["w0"][0].split("-gpu")
    q.depart(f"{node}-{g}a", 2000)
    q.depart(f"{node}-{g}b", 2000)
    assert [(a.claim, a.allocation.gpus) for a in q.admit(2000)] == [("w0", targets["w0"])]
    assert "w1" in gpus_of(q)  # the share is free again: the next of the front's shape holds
    no_holds_left(ledger)
    checked(q)


@pytest.mark.parametrize(("worst", "halves", "held"), [
    (True, 3600.0, {"w0"}),  # halves lately wait longer (p99 1 h against 20 min): the front's own target alone
    (True, 600.0, {"w0", "w1"}),  # whole cards wait longest lately: their shape holds its share
    (False, 3600.0, {"w0", "w1"}),  # worst=off (the default): the share whatever the others wait
])
def test_worst_on_lets_the_fronts_shape_hold_its_share_only_while_its_product_waits_longest(
        worst: bool, halves: float, held: set[str]) -> None:
    """The what-if ``worst=on`` (``front_worst``): the front's shape holds one GPU in ``front`` only while its
    product's recent p99 wait is the longest; else only the front's own target, and the next claim is told why."""
    q, ledger = two_wholes_and_a_half_waiting(front_share=4, worst=worst, single="share",  # it has a share
                                              lately={"v100-100": 1200.0, "v100-50": halves})
    assert set(gpus_of(q)) == held | {"half"} and strategy(q).front() == "w0"
    why = by_claim(q, 5)
    assert why["w0"].reason == WAITING_FOR_RESERVATION
    if "w1" in held:
        assert why["w1"].reason == WAITING_FOR_RESERVATION
    else:
        assert why["w1"].reason == NO_CAPACITY and why["w1"].message.endswith(
            "claims asking for the same GPUs hold only the longest-waiting one's drain target while v100-50 waits "
            "longer lately (p99 60 min)"), why["w1"].message
    no_holds_left(ledger)
    checked(q)


ONLY_OWN = "claims asking for the same GPUs hold only the longest-waiting one's drain target"


@pytest.mark.parametrize(("single", "limits", "held", "told"), [
    ("sure", True, {"w0", "w1"}, None),  # the default: declared ends free the front's target, its shape's share
    ("sure", False, {"w0"}, f"{ONLY_OWN} until the pods on its GPUs declare runtimes"),  # no ends: its own alone
    ("own", True, {"w0"}, ONLY_OWN),  # single=own: its own alone, ends or not
    ("share", False, {"w0", "w1"}, None),  # single=share: the share, ends or not
])
def test_single_sets_what_the_shape_of_a_front_of_one_gpu_holds(single: str, limits: bool, held: set[str],
                                                               told: str | None) -> None:
    """``single_front`` (``single=``): the shape of a front of one GPU holds one GPU in ``front`` (4: two of these
    8) while declared ends free the front's own target (sure, the default), always (share), or never (own); else
    the front's own target alone, and the next claim of it is told so."""
    q, ledger = two_wholes_and_a_half_waiting(front_share=4, single=single, limits=limits)
    assert set(gpus_of(q)) == held | {"half"} and strategy(q).front() == "w0"
    assert strategy(q).drain.front_declared() == limits
    why = by_claim(q, 5)
    if told is not None:
        assert why["w1"].reason == NO_CAPACITY and why["w1"].message.endswith(told), why["w1"].message
    else:
        assert why["w1"].reason == WAITING_FOR_RESERVATION
    no_holds_left(ledger)
    checked(q)


def test_single_own_leaves_a_front_of_several_cards_its_share() -> None:
    """``single=own`` caps fronts of one GPU only: two pairs on 8 GPUs with ``front=2`` (4 GPUs, two targets) and
    no spare limit both hold, no runtime declared, as under ``single=share``."""
    ledger = ledger_with(4, 4)
    q = wf_queue(ledger, max_drain_targets=4,
                 worst_first=WorstFirstSettings(front_share=2, spare_window=None, single_front="own"))
    a_quarter_free_on_each(q, ledger)
    q.arrive(claim("p0", W2, at=0.0))
    q.arrive(claim("p1", W2, at=1.0))
    assert q.admit(5.0) == [] and set(gpus_of(q)) == {"p0", "p1"}
    assert {c: e.reason for c, e in by_claim(q, 5.0).items()} == dict.fromkeys(("p0", "p1"), WAITING_FOR_RESERVATION)
    no_holds_left(ledger)
    checked(q)


def zoned_ledger() -> Ledger:
    """Nodes n0 (zone a) and n1 (zone b), 4 cards each."""
    ledger = Ledger()
    for i, zone in enumerate("ab"):
        ledger.add_node(f"n{i}", [(f"n{i}-gpu{j}", V100, 32768) for j in range(4)], labels={"zone": zone})
    return ledger


def test_claims_asking_the_fronts_gpus_share_its_hold_whatever_host_cpu_memory_or_node_constraints_they_ask() -> None:
    """Pods of one product differ in host CPU, memory and node constraints, each difference a request shape of
    its own. The front's share and its hold cover every claim asking the GPUs it asks (``gpu_ask``): before,
    a whole card asking another CPU got a target of its own, past the share, and steered beside the front's."""
    ledger = zoned_ledger()
    share = WorstFirstSettings(single_front="share")  # what the front asks holds 1 of the 8 GPUs
    q = wf_queue(ledger, max_drain_targets=4, worst_first=share)
    a_quarter_free_on_each(q, ledger, limits=True)
    other_cpu = replace(W, cpu_milli=4000, host_memory_mib=8192)
    pinned = replace(W, constraints=NodeConstraints(node_selector=(("zone", "b"),)))  # n1 only
    q.arrive(claim("w0", W, at=0))
    q.arrive(claim("w-cpu", other_cpu, at=1))
    q.arrive(claim("w-pinned", pinned, at=2))
    q.arrive(claim("half", H, at=3))
    assert q.admit(5) == []
    assert set(gpus_of(q)) == {"w0", "half"} and strategy(q).front() == "w0"
    why = by_claim(q, 5)
    for name in ("w-cpu", "w-pinned"):
        assert why[name].reason == NO_CAPACITY
        assert why[name].message.endswith("the drain targets of claims asking for the same GPUs, one GPU in 8 at "
                                          "most, go to longer-waiting ones"), why[name].message
    # a wider share: each gets a target of its own, and all three are held with the front's (none steers)
    q2 = wf_queue(zoned_ledger(), max_drain_targets=4, worst_first=replace(share, front_share=2))
    a_quarter_free_on_each(q2, q2.ledger, limits=True)
    for i, (name, r) in enumerate((("w0", W), ("w-cpu", other_cpu), ("w-pinned", pinned))):
        q2.arrive(claim(name, r, at=float(i)))
    assert q2.admit(5) == [] and set(gpus_of(q2)) == {"w0", "w-cpu", "w-pinned"}
    assert {c: e.reason for c, e in by_claim(q2, 5).items()} == dict.fromkeys(
        ("w0", "w-cpu", "w-pinned"), WAITING_FOR_RESERVATION)
    assert gpus_of(q2)["w-pinned"][0].startswith("n1-")  # each target still fits its own claim's node
    # the default (single=sure), no runtime declared: the front's own target alone, for every claim asking its GPUs
    q3 = wf_queue(zoned_ledger(), max_drain_targets=4)
    a_quarter_free_on_each(q3, q3.ledger)
    for i, (name, r) in enumerate((("w0", W), ("w-cpu", other_cpu), ("w-pinned", pinned), ("half", H))):
        q3.arrive(claim(name, r, at=float(i)))
    assert q3.admit(5) == [] and set(gpus_of(q3)) == {"w0", "half"}
    for name in ("w-cpu", "w-pinned"):
        assert by_claim(q3, 5)[name].message.endswith(f"{ONLY_OWN} until the pods on its GPUs declare runtimes")
    for x in (q, q2, q3):
        no_holds_left(x.ledger)
        checked(x)


@pytest.mark.parametrize("spare", [SPARE_WINDOW, None])
def test_a_multi_card_fronts_shape_holds_at_most_the_gpus_spare_lately(spare: float | None) -> None:
    """``SPARE_WINDOW``: on 8 GPUs with a quarter free on each (2 GPUs spare), two pairs wait; ``front=2`` lets
    their shape hold 4 GPUs, two targets. From the second step on (the first observes the spare capacity) it
    holds 2, the front's own target only, and the second pair is told why; with ``spare=off`` (None) both hold."""
    ledger = ledger_with(4, 4)
    # single=share, so that the single-GPU fronts below have a share for the spare limit to leave alone
    q = wf_queue(ledger, max_drain_targets=4,
                 worst_first=WorstFirstSettings(front_share=2, spare_window=spare, single_front="share"))
    a_quarter_free_on_each(q, ledger)
    q.arrive(claim("p0", W2, at=0.0))
    q.arrive(claim("p1", W2, at=1.0))
    assert q.admit(5.0) == [] and set(gpus_of(q)) == {"p0", "p1"}  # nothing observed yet: one GPU in 2 alone
    assert strategy(q).clock.spare_lately(5.0) == (None if spare is None else 2.0)
    assert q.admit(600.0) == []
    if spare is None:
        assert set(gpus_of(q)) == {"p0", "p1"}
        return
    assert set(gpus_of(q)) == {"p0"} and strategy(q).front() == "p0"
    why = by_claim(q, 600.0)["p1"]
    assert why.reason == NO_CAPACITY and why.message.endswith(
        "the drain targets of claims asking for the same GPUs, at most the 2 GPUs the cluster has had spare lately "
        "(one GPU in 2 at most), go to longer-waiting ones"), why.message
    # single-GPU fronts are not capped by it: three whole cards all hold 3 GPUs with 2 spare
    q.withdraw("p0")
    q.withdraw("p1")
    for i in range(3):
        q.arrive(claim(f"w{i}", W, at=700.0 + i))
    assert q.admit(800.0) == [] and set(gpus_of(q)) == {"w0", "w1", "w2"}
    no_holds_left(ledger)
    checked(q)


def test_a_claim_that_fits_only_on_the_fronts_gpus_is_blocked_unless_it_ends_first() -> None:
    ledger = ledger_with(1)
    q = wf_queue(ledger)
    run(q, ledger, "half", H, "n0", 0, limit=1000.0)
    q.arrive(claim("whole", W, at=0))
    q.arrive(claim("long", Q, at=1, limit=2000.0))
    q.arrive(claim("short", Q, at=2, limit=500.0))
    q.arrive(claim("undeclared", Q, at=3))
    admitted = q.admit(5)
    assert [(a.claim, a.backfill) for a in admitted] == [("short", True)]
    why = by_claim(q, 5)
    assert why["whole"].reason == WAITING_FOR_RESERVATION and why["whole"].estimated_start == 1000.0
    for name in ("long", "undeclared"):
        assert why[name].reason == BLOCKED_BY_HEAD_OF_LINE
        assert "held for the longest-waiting claim, team/whole (v100-100, waited 5 s)" in why[name].message
    no_holds_left(ledger)
    checked(q)


@pytest.mark.parametrize(("waits", "kind", "expected"), [
    ({}, "v100-100x2", 0.0),  # nothing seen: no clock
    ({"v100-25": 60.0, "v100-50": 600.0}, "v100-100x2", 600.0),  # the longest p99 of the others
    ({"v100-100x2": 5000.0, "v100-50": 600.0}, "v100-100x2", 600.0),  # its own tail does not count
    ({"v100-50": 10 * 3600.0}, "v100-100x2", MAX_CLOCK),  # at most MAX_CLOCK
])
def test_the_hold_clock_is_the_longest_recent_p99_of_the_other_products(
        waits: dict[str, float], kind: str, expected: float) -> None:
    h = WaitHistory()
    for product, tail in waits.items():
        for i in range(100):
            h.add(product, tail if i < 2 else 0.0)  # the two longest of 100: the 99th percentile
    assert HoldClock().clock(h, kind, now=1.0) == pytest.approx(expected)


def test_a_multi_card_claim_gets_a_target_only_past_its_hold_clock() -> None:
    ledger = ledger_with(2)
    q = wf_queue(ledger, worst_first=WorstFirstSettings(hold_within=math.inf))  # held at once, once a head (R: below)
    book = q.view(0.0).book
    for i in range(100):
        book.waits.add("v100-25", 900.0 if i < 2 else 0.0)  # quarters lately: p99 15 min
    run(q, ledger, "q", Q, "n0", 0, limit=5000.0)
    q.arrive(claim("pair", W2, at=0))
    assert q.admit(600) == [] and gpus_of(q) == {}
    why = by_claim(q, 600)["pair"]
    assert why.reason == NO_CAPACITY and "it gets a drain target once it has waited 15 min" in why.message
    assert q.admit(900) == [] and {c: set(g) for c, g in gpus_of(q).items()} == {"pair": {"n0-gpu0", "n0-gpu1"}}
    assert by_claim(q, 900)["pair"].reason == WAITING_FOR_RESERVATION
    no_holds_left(ledger)


def test_clock_never_keeps_claims_of_several_cards_off_the_targets() -> None:
    """The what-if ``clock=never``: a pair waits as under best effort, holds nothing, and is told so."""
    ledger = ledger_with(2)
    q = ClaimQueue(ledger, admission=WORST_FIRST, worst_first=WorstFirstSettings(hold_clock=math.inf))
    run(q, ledger, "q", Q, "n0", 0, limit=5000.0)
    run(q, ledger, "q2", Q, "n0", 1, limit=5000.0)
    q.arrive(claim("pair", W2, at=0))
    for now in (600.0, 5 * 86400.0):
        assert q.admit(now) == [] and gpus_of(q) == {}
        why = by_claim(q, now)["pair"]
        assert why.reason == NO_CAPACITY and "claims of several cards get no drain target here" in why.message
    q.arrive(claim("whole", W, at=10.0))  # a single-GPU claim still gets its target at once
    assert q.admit(5 * 86400.0) == [] and set(gpus_of(q)) == {"whole"}
    assert by_claim(q, 5 * 86400.0)["whole"].reason == WAITING_FOR_RESERVATION
    no_holds_left(ledger)


@pytest.mark.parametrize("within", [math.inf, None])
def test_within_holds_a_multi_card_front_only_once_its_target_likely_frees_within_its_wait(
        within: float | None) -> None:
    """``HOLD_WITHIN`` (R = 1, the default: None): a pair's target steers (a half that fits only there starts)
    while it likely frees only after R x the pair's wait, and is held once it likely frees within it. With
    ``within=off`` (inf), held at once."""
    ledger = ledger_with(2)
    q = ClaimQueue(ledger, admission=WORST_FIRST,
                   worst_first=None if within is None else WorstFirstSettings(hold_within=within))
    run(q, ledger, "h0", H, "n0", 0, limit=5000.0)  # the pair's target frees by its declared end, 5000 s
    q.arrive(claim("pair", W2, at=0.0))
    assert q.admit(1.0) == [] and set(gpus_of(q)["pair"]) == {"n0-gpu0", "n0-gpu1"}
    q.arrive(claim("h1", H, at=600.0))  # fits only on the pair's target; declares no limit (no backfill)
    started = [a.claim for a in q.admit(600.0)]
    if within == math.inf:
        assert started == [] and reasons(q, 600.0) == {"pair": WAITING_FOR_RESERVATION,
                                                       "h1": BLOCKED_BY_HEAD_OF_LINE}
        return
    assert started == ["h1"]  # 5000 is past 600 + max(30 min, 600 s): the target steers
    why = by_claim(q, 600.0)["pair"]
    assert why.reason == NO_CAPACITY and "held for it once it likely frees within 30 min" in why.message, why.message
    q.depart("h1", 2000.0)
    q.arrive(claim("h2", H, at=2600.0))
    assert q.admit(2600.0) == []  # 5000 <= 2600 + 1 x 2600: held now, h2 waits
    assert reasons(q, 2600.0) == {"pair": WAITING_FOR_RESERVATION, "h2": BLOCKED_BY_HEAD_OF_LINE}
    no_holds_left(ledger)


@pytest.mark.parametrize(("idle", "limit", "held_at"), [
    (None, None, 8500.0),  # K = 2: likely only within 2 x 900 s (30 min at least), from 8200 s on
    (math.inf, None, 6000.0),  # idle=off: likely within R x its wait, 6000 s, as before
    (None, 10000.0, 6000.0),  # declared ends free it within R x its wait: held, whatever K x H
])
def test_idle_holds_a_multi_card_front_only_once_its_target_likely_frees_within_k_times_its_clock(
        idle: float | None, limit: float | None, held_at: float) -> None:
    """``HOLD_IDLE`` (K = 2): a pair's target, whose half has run for as long as the pair waited, likely frees
    within R x that wait, but a hold would idle the free GPU longer than K x the pair's clock H (the quarters'
    p99, 15 min; at least 30 min): it steers until it likely frees within that, unless declared ends free it
    within R x the wait (the bound's case)."""
    ledger = ledger_with(2)
    q = ClaimQueue(ledger, admission=WORST_FIRST,
                   worst_first=None if idle is None else WorstFirstSettings(hold_idle=idle))
    book = q.view(0.0).book
    for i in range(100):
        book.waits.add("v100-25", 900.0 if i < 2 else 0.0)  # quarters lately: p99 15 min, the pair's clock
        book.history.add("v100-50", 10000.0)  # halves run 10000 s
    run(q, ledger, "h0", H, "n0", 0, limit=limit)
    q.arrive(claim("pair", W2, at=0.0))
    assert q.admit(900.0) == [] and set(gpus_of(q)["pair"]) == {"n0-gpu0", "n0-gpu1"}
    for now in (6000.0, 8500.0):
        q.arrive(claim(f"h{now:.0f}", H, at=now))  # fits only on the pair's target, and declares no limit
        started = [a.claim for a in q.admit(now)]
        if now >= held_at:
            assert started == [] and reasons(q, now) == {"pair": WAITING_FOR_RESERVATION,
                                                           f"h{now:.0f}": BLOCKED_BY_HEAD_OF_LINE}
            break
        assert started == [f"h{now:.0f}"]  # the target steers: the half starts there
        why = by_claim(q, now)["pair"]
        assert why.reason == NO_CAPACITY and "held for it once it likely frees within 30 min" in why.message
        q.depart(f"h{now:.0f}", now + 1.0)
    else:
        raise AssertionError("never held")
    no_holds_left(ledger)


def test_a_waiting_claim_is_told_what_its_products_recent_waits_say() -> None:
    ledger = ledger_with(1)
    q = wf_queue(ledger)
    for i in range(30):  # 30 halves admitted after waiting 0..29 minutes
        q.arrive(claim(f"h{i}", H, at=-60.0 * i))
        [a] = q.admit(0.0)
        q.depart(a.claim, 0.0)
    run(q, ledger, "whole", W, "n0", 0)
    q.arrive(claim("late", H, at=-600.0))
    assert q.admit(0.0) == []
    e = by_claim(q, 0.0)["late"]
    assert e.wait_lately is not None and e.wait_lately.kind == "v100-50" and e.wait_lately.seen == 30
    assert e.expected_in == pytest.approx(10.0 * 60)  # of those that waited over 10 min (11..29), the median: 20
    assert reasons(q, 0.0) == {"late": WAITING_FOR_RESERVATION}
