"""``aging-guard`` (``packing.admission.aging_guard``): a starving head holds one node, its drain target."""

from __future__ import annotations

from packing.admission import AgingGuard
from packing.entitlements import Entitlement
from packing.products import Request
from packing.queue import (
    ADMISSIBLE,
    AGING_GUARD,
    BLOCKED_BY_HEAD_OF_LINE,
    NO_CAPACITY,
    QUOTA_EXCEEDED,
    WAITING_FOR_RESERVATION,
)
from tests.unit.queue_helpers import (
    W2,
    H,
    Q,
    T,
    W,
    blocked_whole_card,
    by_claim,
    checked,
    claim,
    fill,
    ledger_with,
    queue,
    reasons,
)


def test_aging_guard_is_best_effort_until_the_head_waited_its_limit() -> None:
    q, _ = blocked_whole_card(AGING_GUARD)
    assert [a.claim for a in q.admit(T)] == ["quarter"]  # whole has waited T - 1: best effort
    q.arrive(claim("quarter2", Q, at=T))
    q.arrive(claim("quarter3", Q, at=T + 1))
    q.depart("quarter", T + 2)
    assert q.admit(T + 2) == []  # whole has waited past T: the guard holds quarter2 and quarter3
    why = by_claim(q, T + 2)
    assert why["whole"].reason == WAITING_FOR_RESERVATION
    assert "waited 10 min 1 s, past its 10 min limit" in why["whole"].message
    assert "estimated start unknown" in why["whole"].message and why["whole"].estimated_start is None
    assert why["quarter2"].reason == BLOCKED_BY_HEAD_OF_LINE
    assert why["quarter3"].reason == BLOCKED_BY_HEAD_OF_LINE
    held_for = "holding node n0 for the head of the line, team/whole (v100-100, waited 10 min 1 s"
    assert held_for in why["quarter2"].message
    assert "holding node n0 for it" in why["whole"].message and q.drain_targets() == {"whole": "n0"}
    q.depart("running", T + 3)
    assert [a.claim for a in q.admit(T + 3)] == ["whole"]
    assert reasons(q, T + 3) == {"quarter2": NO_CAPACITY, "quarter3": NO_CAPACITY}
    checked(q)


def test_age_limit_is_per_product() -> None:
    ledger = ledger_with(1)
    q = queue(ledger, age_limits={"v100-100": 100.0}, default_age_limit=10_000.0)
    fill(q, ledger, [("running", Q)])
    q.arrive(claim("whole", W, at=0))
    q.arrive(claim("quarter", Q, at=1))
    assert q.admit(101) == []
    assert reasons(q, 101)["whole"] == WAITING_FOR_RESERVATION
    assert q.age_limit("v100-100") == 100.0 and q.age_limit("v100-25") == 10_000.0


def test_aging_guard_backfills_claims_that_end_before_the_head_can_start() -> None:
    ledger = ledger_with(1)
    q = queue(ledger)
    fill(q, ledger, [("r1", H), ("r2", Q)], now=0.0, limit=1000.0)  # the card is whole again at 1000
    q.arrive(claim("whole", W, at=0))
    q.arrive(claim("long", Q, at=1, limit=800.0))  # would end at T+1+800 > 1000
    q.arrive(claim("short", Q, at=2, limit=300.0))  # ends at T+1+300 <= 1000
    q.arrive(claim("undeclared", Q, at=3))
    q.depart("r2", T + 1)
    admitted = q.admit(T + 1)
    assert [(a.claim, a.backfill) for a in admitted] == [("short", True)]
    why = by_claim(q, T + 1)
    assert why["whole"].reason == WAITING_FOR_RESERVATION and why["whole"].estimated_start == 1000.0
    assert why["long"].reason == BLOCKED_BY_HEAD_OF_LINE and why["undeclared"].reason == BLOCKED_BY_HEAD_OF_LINE
    assert "estimated start (in 6 min 39 s)" in why["long"].message
    q.depart("short", 950)
    q.depart("r1", 1000)
    assert [a.claim for a in q.admit(1000)] == ["whole"]
    checked(q)


def test_backfill_takes_the_shortest_declared_limit_first_among_identical_claims() -> None:
    ledger = ledger_with(1)
    q = queue(ledger)
    fill(q, ledger, [("r1", H), ("r2", Q), ("r3", Q)], now=0.0, limit=2000.0)
    q.arrive(claim("whole", W, at=0))
    q.arrive(claim("longer", Q, at=1, limit=900.0))  # both end before 2000: one free quarter
    q.arrive(claim("shorter", Q, at=2, limit=100.0))
    q.depart("r2", T + 1)
    assert [(a.claim, a.backfill) for a in q.admit(T + 1)] == [("shorter", True)]
    assert reasons(q, T + 1) == {"whole": WAITING_FOR_RESERVATION, "longer": NO_CAPACITY}
    checked(q)


def test_a_starving_low_priority_claim_guards_behind_higher_priority_claims_of_its_shape() -> None:
    ledger = ledger_with(1)
    q = queue(ledger)
    fill(q, ledger, [("running", Q)])
    q.arrive(claim("old-low", W, at=0, priority=0))
    q.arrive(claim("new-high", W, at=T, priority=5))
    q.arrive(claim("quarter", Q, at=T))
    assert q.admit(T + 1) == []
    why = by_claim(q, T + 1)
    assert [e.claim for e in q.explain(T + 1)] == ["new-high", "old-low", "quarter"]
    assert why["new-high"].reason == NO_CAPACITY
    assert why["old-low"].reason == WAITING_FOR_RESERVATION
    assert why["quarter"].reason == BLOCKED_BY_HEAD_OF_LINE


def test_a_starving_claim_over_its_entitlement_does_not_guard() -> None:
    ledger = ledger_with(1)
    q = queue(ledger)
    fill(q, ledger, [("running", Q)])
    q.set_entitlement("capped", Entitlement({"v100-100": 0}))
    q.arrive(claim("capped", W, at=0, ns="capped"))
    q.arrive(claim("quarter", Q, at=1))
    assert [a.claim for a in q.admit(T * 5)] == ["quarter"]
    assert reasons(q, T * 5) == {"capped": QUOTA_EXCEEDED}


def test_a_multi_card_head_drains_one_node_while_the_others_keep_filling() -> None:
    ledger = ledger_with(2, 2, 2)
    q = queue(ledger)
    # n1 is closest to holding two empty cards: one quarter per card, against three elsewhere
    running = [(f"{n}-{g}-{i}", n, g) for n, per_card in (("n0", 3), ("n1", 1), ("n2", 3))
               for g in range(2) for i in range(per_card)]
    for name, node, g in running:
        ledger.assign(name, Q, node, (f"{node}-gpu{g}",))
        q.start(name, "filler", Q, now=0)
    q.arrive(claim("pair", W2, at=0))
    assert q.admit(T) == []
    assert q.admit(T + 1) == [] and q.drain_targets() == {"pair": "n1"}
    for i in range(6):  # younger quarters: two free quarters on n0, two on n2, six on the target n1
        q.arrive(claim(f"young{i}", Q, at=T + 2))
    admitted = q.admit(T + 2)
    assert [a.allocation.node for a in admitted] == ["n0", "n0", "n2", "n2"]
    why = by_claim(q, T + 2)
    assert why["pair"].reason == WAITING_FOR_RESERVATION and "holding node n1 for it" in why["pair"].message
    assert why["young4"].reason == BLOCKED_BY_HEAD_OF_LINE
    said = why["young4"].message
    assert "holding node n1 for the head of the line, team/pair (2 x v100-100, waited 10 min 2 s" in said
    q.depart("n0-0-0", T + 3)  # room on another node goes to the younger claims at once
    assert [(a.claim, a.allocation.node) for a in q.admit(T + 3)] == [("young4", "n0")]
    q.depart("n1-0-0", T + 4)  # room on the target stays free for the head
    assert q.admit(T + 4) == [] and q.drain_targets() == {"pair": "n1"}
    assert reasons(q, T + 4)["young5"] == BLOCKED_BY_HEAD_OF_LINE
    q.depart("n1-1-0", T + 5)
    assert [(a.claim, a.allocation.node) for a in q.admit(T + 5)] == [("pair", "n1")]
    assert q.drain_targets() == {} and reasons(q, T + 5) == {"young5": NO_CAPACITY}
    checked(q)


def test_the_drain_target_is_the_node_of_the_earliest_estimated_start() -> None:
    ledger = ledger_with(1, 1, 1)
    q = queue(ledger)
    running = [("n0", H, 5000.0), ("n0", Q, 5000.0), ("n1", H, None), ("n1", Q, None), ("n2", H, 3000.0)]
    for i, (node, r, limit) in enumerate(running):
        ledger.assign(f"run{i}", r, node, (f"{node}-gpu0",))
        q.start(f"run{i}", "filler", r, now=0, time_limit=limit)
    q.arrive(claim("whole", W, at=0))
    assert q.admit(T + 1) == []
    assert q.drain_targets() == {"whole": "n2"}
    [e] = q.explain(T + 1)
    assert e.estimated_start == 3000.0 and "holding node n2 for it" in e.message
    q.arrive(claim("long", H, at=T + 1, limit=5000.0))  # fits only on the target, would end after 3000
    q.arrive(claim("short", H, at=T + 1, limit=100.0))  # ends by 3000: may use the target
    why = by_claim(q, T + 2)  # before the step: what it will do
    assert why["short"].reason == ADMISSIBLE
    assert why["long"].reason == BLOCKED_BY_HEAD_OF_LINE and "estimated start (in 39 min 58 s)" in why["long"].message
    assert [(a.claim, a.allocation.node, a.backfill) for a in q.admit(T + 2)] == [("short", "n2", True)]
    checked(q)


def test_the_drain_target_is_kept_while_the_head_starves_and_re_picked_when_its_node_leaves() -> None:
    ledger = ledger_with(1, 1, 1)
    q = queue(ledger)
    for node, n in (("n0", 2), ("n1", 1), ("n2", 3)):
        for i in range(n):
            ledger.assign(f"{node}-{i}", Q, node, (f"{node}-gpu0",))
            q.start(f"{node}-{i}", "filler", Q, now=0)
    q.arrive(claim("whole", W, at=0))
    assert q.admit(T + 1) == [] and q.drain_targets() == {"whole": "n1"}  # most free, no declared ends
    q.depart("n0-0", T + 2)  # n0 now ties with n1, and comes first in node order: a fresh pick would move
    q.arrive(claim("young", Q, at=T + 2))
    assert [(a.claim, a.allocation.node) for a in q.admit(T + 2)] == [("young", "n2")]
    assert q.drain_targets() == {"whole": "n1"}
    ledger.remove_node("n1")
    assert q.admit(T + 3) == [] and q.drain_targets() == {"whole": "n0"}
    q.depart("n0-1", T + 4)
    assert [a.claim for a in q.admit(T + 4)] == ["whole"] and q.drain_targets() == {}


def test_heads_of_different_shapes_hold_distinct_targets_up_to_the_cap() -> None:
    half = Request(milli=500, memory_mib=16384)  # another shape, no product name
    for max_targets, expected in ((8, 2), (1, 1)):
        ledger = ledger_with(*[1] * 8)  # eight nodes: at most two targets
        q = queue(ledger, max_drain_targets=max_targets)
        assert isinstance(q.strategy, AgingGuard) and q.strategy.drain_cap(ledger) == expected
        for i in range(8):
            for j, r in enumerate((H, Q)):
                ledger.assign(f"run{i}-{j}", r, f"n{i}", (f"n{i}-gpu0",))
                q.start(f"run{i}-{j}", "filler", r, now=0)
        q.arrive(claim("whole", W, at=0))
        q.arrive(claim("half", H, at=1))
        q.arrive(claim("other", half, at=2))
        assert q.admit(T + 10) == []
        targets = q.drain_targets()
        assert list(targets) == ["whole", "half"][:expected]
        assert len(set(targets.values())) == expected
        why = reasons(q, T + 10)
        second = WAITING_FOR_RESERVATION if expected == 2 else NO_CAPACITY
        assert why == {"whole": WAITING_FOR_RESERVATION, "half": second, "other": NO_CAPACITY}
        checked(q)
