"""The claim queue: order, entitlements, each waiting reason, admission policies, withdrawal and bookkeeping."""

from __future__ import annotations

import json

import pytest

from packing.admission import AgingGuard
from packing.entitlements import Entitlement, EntitlementError
from packing.estimate import estimated_start
from packing.ledger import Ledger
from packing.policies import BEST_FIT
from packing.products import Catalog, Request, load_catalog
from packing.queue import (
    ADMISSIBLE,
    ADMISSION_POLICIES,
    AGING_GUARD,
    BEST_EFFORT_FIFO,
    BLOCKED_BY_HEAD_OF_LINE,
    NO_CAPACITY,
    QUOTA_EXCEEDED,
    STRICT_FIFO,
    UNSATISFIABLE,
    WAITING_FOR_RESERVATION,
    ClaimQueue,
    Explanation,
    QueueError,
    UnknownClaimError,
    WaitingClaim,
)

V100 = "Tesla-V100-SXM2-32GB"
T4 = "Tesla-T4"
CATALOG: Catalog = load_catalog()
Q = CATALOG.request("v100-25")
H = CATALOG.request("v100-50")
W = CATALOG.request("v100-100")
W2 = CATALOG.request("v100-100", count=2)
T = 600.0  # the age limit used where a test needs the guard


def ledger_with(*shape: int, model: str = V100) -> Ledger:
    """Nodes n0, n1, ... with ``shape[i]`` cards each."""
    ledger = Ledger()
    for i, n in enumerate(shape):
        ledger.add_node(f"n{i}", [(f"n{i}-gpu{j}", model, 32768) for j in range(n)])
    return ledger


def claim(name: str, request: Request, at: float, ns: str = "team", priority: int = 0,
          limit: float | None = None) -> WaitingClaim:
    return WaitingClaim(name, ns, request, arrived_at=at, priority=priority, time_limit=limit)


def queue(ledger: Ledger, admission: str = AGING_GUARD, **kwargs: object) -> ClaimQueue:
    kwargs.setdefault("default_age_limit", T)
    return ClaimQueue(ledger, admission=admission, **kwargs)  # type: ignore[arg-type]


def reasons(q: ClaimQueue, now: float) -> dict[str, str]:
    return {e.claim: e.reason for e in q.explain(now)}


def by_claim(q: ClaimQueue, now: float) -> dict[str, Explanation]:
    return {e.claim: e for e in q.explain(now)}


def fill(q: ClaimQueue, ledger: Ledger, names: list[tuple[str, Request]], now: float = 0.0,
         limit: float | None = None) -> None:
    """Admit ``names`` right away (they must fit), as running claims."""
    for name, r in names:
        q.arrive(claim(name, r, now, ns="filler", limit=limit))
    admitted = {a.claim for a in q.admit(now)}
    assert admitted == {n for n, _ in names}


def checked(q: ClaimQueue) -> None:
    q.verify()
    q.ledger.verify()


# ---- order and admission --------------------------------------------------------------------------


def test_admits_in_priority_then_arrival_order_and_commits() -> None:
    ledger = ledger_with(1)
    q = queue(ledger)
    q.arrive(claim("late-high", Q, at=5, priority=1))
    q.arrive(claim("early", Q, at=1))
    q.arrive(claim("tie-first", Q, at=3))
    q.arrive(claim("tie-second", Q, at=3))
    q.arrive(claim("overflow", Q, at=4))
    admitted = q.admit(10)
    assert [a.claim for a in admitted] == ["late-high", "early", "tie-first", "tie-second"]
    assert [a.waited for a in admitted] == [5, 9, 7, 7]
    assert all(a.allocation.expires_at is None for a in admitted)  # no TTL: committed at once
    assert all(ledger.allocations[a.claim] == a.allocation for a in admitted)
    assert [c.claim for c in q.in_order()] == ["overflow"]
    assert q.waiting() == 1 and q.running() == 4
    checked(q)


def test_reservation_ttl_admits_reservations_that_lapse_back_into_line() -> None:
    ledger = ledger_with(1)
    q = queue(ledger, reservation_ttl=30.0)
    q.arrive(claim("a", W, at=0))
    q.arrive(claim("b", Q, at=1))
    [a] = q.admit(10)
    assert a.claim == "a" and a.allocation.expires_at == 40.0
    assert q.usage("team").slices == {"v100-100": 1}
    # never bound: at expiry the slice is free again and "a" is back ahead of "b"
    expired = q.expire(40.0)
    assert [x.claim for x in expired] == ["a"]
    assert [c.claim for c in q.in_order()] == ["a", "b"]
    assert q.usage("team").milli == 0
    assert [x.claim for x in q.admit(41.0)] == ["a"]
    ledger.commit("a")
    assert q.expire(100.0) == []
    assert q.state("a") == "running"
    checked(q)


def test_requeue_puts_an_admitted_claim_back_at_its_place() -> None:
    ledger = ledger_with(1)
    q = queue(ledger)
    q.arrive(claim("a", H, at=0))
    q.arrive(claim("b", H, at=1))
    q.arrive(claim("c", W, at=2))
    assert [x.claim for x in q.admit(5)] == ["a", "b"]
    q.requeue("a")
    assert "a" not in ledger.allocations
    assert [c.claim for c in q.in_order()] == ["a", "c"]
    assert q.claim("a").arrived_at == 0
    with pytest.raises(UnknownClaimError):
        q.requeue("zzz")
    checked(q)


# ---- reasons --------------------------------------------------------------------------------------


def test_no_capacity_says_what_it_waits_for() -> None:
    ledger = ledger_with(1)
    q = queue(ledger, BEST_EFFORT_FIFO)
    fill(q, ledger, [("f1", H), ("f2", Q)])
    q.arrive(claim("half", H, at=1))
    assert q.admit(2) == []
    [e] = q.explain(62)
    assert (e.reason, e.position, e.product_position, e.product, e.waited) == (NO_CAPACITY, 1, 1, "v100-50", 61)
    assert e.message == "needs a 500-milli slice (v100-50); largest free is 250 on node n0"


def test_no_capacity_for_several_whole_cards_names_the_emptiest_node() -> None:
    ledger = ledger_with(2, 1)
    q = queue(ledger, BEST_EFFORT_FIFO)
    ledger.assign("f", Q, "n0", ("n0-gpu0",))
    q.start("f", "team", Q, now=0)
    q.arrive(claim("two", W2, at=0))
    assert q.admit(1) == []
    [e] = q.explain(1)
    assert e.reason == NO_CAPACITY
    assert e.message == "needs 2 empty cards on one node (v100-100); at most 1 on node n0"


def test_quota_exceeded_waits_without_taking_capacity_and_lifts_at_run_time() -> None:
    ledger = ledger_with(2)
    q = queue(ledger)
    q.set_entitlement("team", Entitlement({"v100-25": 2}))
    for i in range(4):
        q.arrive(claim(f"q{i}", Q, at=i))
    q.arrive(claim("other", Q, at=9, ns="other-team"))
    assert [a.claim for a in q.admit(10)] == ["q0", "q1", "other"]
    why = by_claim(q, 10)
    assert {c: e.reason for c, e in why.items()} == {"q2": QUOTA_EXCEEDED, "q3": QUOTA_EXCEEDED}
    assert why["q2"].message == "namespace team holds 2 of its 2 v100-25 slice(s); this claim needs 1 more"
    assert q.usage("team").slices == {"v100-25": 2} and q.usage("team").milli == 500
    q.set_entitlement("team", Entitlement({"v100-25": 3}))
    assert [a.claim for a in q.admit(11)] == ["q2"]
    q.set_entitlement("team", None)
    assert [a.claim for a in q.admit(12)] == ["q3"]
    checked(q)


def test_milli_entitlement_caps_the_namespace_total() -> None:
    ledger = ledger_with(4)
    q = queue(ledger)
    q.set_entitlement("team", Entitlement(max_milli=1500))
    q.arrive(claim("w", W, at=0))
    q.arrive(claim("h1", H, at=1))
    q.arrive(claim("h2", H, at=2))
    q.arrive(claim("q", Q, at=3))
    assert [a.claim for a in q.admit(5)] == ["w", "h1"]
    why = by_claim(q, 5)
    assert why["h2"].reason == QUOTA_EXCEEDED and why["q"].reason == QUOTA_EXCEEDED
    assert "holds 1500 of its 1500 milli-GPU" in why["q"].message
    q.depart("h1", 6)
    assert [a.claim for a in q.admit(6)] == ["h2"]


def test_a_claim_over_its_whole_entitlement_is_quota_blocked_not_stuck_elsewhere() -> None:
    ledger = ledger_with(2)
    q = queue(ledger)
    q.set_entitlement("team", Entitlement({"v100-100": 1}))
    q.arrive(claim("two", W2, at=0))
    q.arrive(claim("one", W, at=1))
    assert [a.claim for a in q.admit(5)] == ["one"]
    assert reasons(q, 5) == {"two": QUOTA_EXCEEDED}


def test_unsatisfiable_is_re_evaluated_when_nodes_join() -> None:
    ledger = ledger_with(1, model=T4)
    q = queue(ledger)
    q.arrive(claim("v100", Q, at=0))
    q.arrive(claim("pair", W2, at=1))
    assert q.admit(5) == []
    why = by_claim(q, 5)
    assert why["v100"].reason == UNSATISFIABLE and why["pair"].reason == UNSATISFIABLE
    assert "can never fit" in why["v100"].message and "re-checked when nodes join" in why["v100"].message
    ledger.add_node("v1", [("v1-gpu0", V100, 32768)])
    assert [a.claim for a in q.admit(6)] == ["v100"]
    assert reasons(q, 6) == {"pair": UNSATISFIABLE}
    ledger.add_node("v2", [("v2-gpu0", V100, 32768), ("v2-gpu1", V100, 32768)])
    assert [a.claim for a in q.admit(7)] == ["pair"]
    # a node leaving can turn a satisfiable shape back into an unsatisfiable one
    q.depart("pair", 8)
    ledger.remove_node("v2")
    q.arrive(claim("pair2", W2, at=9))
    assert reasons(q, 9) == {"pair2": UNSATISFIABLE}
    checked(q)


def test_unsatisfiable_starving_head_blocks_nobody() -> None:
    ledger = ledger_with(1)
    q = queue(ledger, STRICT_FIFO)
    q.arrive(claim("pair", W2, at=0))
    q.arrive(claim("q", Q, at=1))
    assert [a.claim for a in q.admit(T * 10)] == ["q"]
    q2 = queue(ledger_with(1))
    q2.arrive(claim("pair", W2, at=0))
    q2.arrive(claim("q", Q, at=1))
    assert [a.claim for a in q2.admit(T * 10)] == ["q"]


def test_explain_before_admit_marks_admissible() -> None:
    q = queue(ledger_with(1))
    q.arrive(claim("a", Q, at=0))
    assert reasons(q, 1) == {"a": ADMISSIBLE}
    q.admit(1)
    assert reasons(q, 1) == {}


# ---- admission policies ---------------------------------------------------------------------------


def blocked_whole_card(admission: str) -> tuple[ClaimQueue, Ledger]:
    """One card, a quarter running, a whole card waiting ahead of a quarter."""
    ledger = ledger_with(1)
    q = queue(ledger, admission)
    fill(q, ledger, [("running", Q)])
    q.arrive(claim("whole", W, at=1))
    q.arrive(claim("quarter", Q, at=2))
    return q, ledger


def test_best_effort_lets_a_fitting_claim_pass_a_head_that_does_not_fit() -> None:
    q, _ = blocked_whole_card(BEST_EFFORT_FIFO)
    assert [a.claim for a in q.admit(T * 10)] == ["quarter"]
    assert reasons(q, T * 10) == {"whole": NO_CAPACITY}


def test_strict_fifo_blocks_everything_behind_a_head_that_does_not_fit() -> None:
    q, _ = blocked_whole_card(STRICT_FIFO)
    assert q.admit(3) == []
    why = by_claim(q, 3)
    assert why["whole"].reason == NO_CAPACITY
    assert why["quarter"].reason == BLOCKED_BY_HEAD_OF_LINE
    assert "strict FIFO keeps it behind whole (v100-100)" in why["quarter"].message
    q.depart("running", 4)
    assert [a.claim for a in q.admit(4)] == ["whole"]


def test_strict_fifo_ignores_quota_blocked_claims() -> None:
    ledger = ledger_with(1)
    q = queue(ledger, STRICT_FIFO)
    q.set_entitlement("capped", Entitlement({"v100-100": 0}))
    q.arrive(claim("capped", W, at=0, ns="capped"))
    q.arrive(claim("q", Q, at=1))
    assert [a.claim for a in q.admit(2)] == ["q"]


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
    assert "holding node n1 for the head of the line, team/pair (v100-100, waited 10 min 2 s" in why["young4"].message
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


def test_estimated_start_releases_declared_ends_in_order() -> None:
    ledger = ledger_with(2)
    q = queue(ledger)
    # best fit: n0-gpu0 takes h0 (ends 500), q0 (ends 300), q1 (ends 100); n0-gpu1 takes h1 (no limit)
    for name, r, limit in [("h0", H, 500.0), ("q0", Q, 300.0), ("h1", H, None), ("q1", Q, 100.0)]:
        q.arrive(claim(name, r, at=0, limit=limit))
        q.admit(0)
    q.arrive(claim("x1", Q, at=0))
    q.arrive(claim("x2", Q, at=0))
    q.admit(0)
    assert ledger.allocations["q1"].gpus == ("n0-gpu0",) and ledger.allocations["x2"].gpus == ("n0-gpu1",)
    assert q.estimated_start(W, 0) == 500.0  # gpu0 empties when all three end; gpu1 never does
    assert q.estimated_start(H, 0) == 300.0  # q1 and q0 free half of gpu0
    assert q.estimated_start(W2, 0) is None  # gpu1 holds a claim without a declared end
    assert estimated_start(ledger, Q, [], 0) is None
    q.depart("x1", 1)
    assert q.estimated_start(Q, 50) == 50  # fits now


def test_estimated_start_counts_the_cpu_a_release_frees() -> None:
    ledger = Ledger()
    ledger.add_node("n0", [("g0", V100, 32768)], cpu_milli=4000, memory_mib=65536)
    q = queue(ledger)
    big_cpu = Request(milli=250, memory_mib=8192, model=Q.model, product="v100-25", cpu_milli=3000)
    q.arrive(claim("cpu-hog", big_cpu, at=0, limit=100.0))
    q.arrive(claim("small", Q, at=0))
    assert len(q.admit(0)) == 2
    wants = Request(milli=500, memory_mib=16384, model=H.model, product="v100-50", cpu_milli=2000)
    assert BEST_FIT.choose(ledger, wants) is None  # the GPU has room, the node's CPU has not
    assert q.estimated_start(wants, 10) == 100.0


# ---- events -----------------------------------------------------------------------------------------


def test_withdraw_removes_a_waiting_claim_and_renumbers() -> None:
    ledger = ledger_with(1)
    q = queue(ledger, BEST_EFFORT_FIFO)
    fill(q, ledger, [("running", W)])
    for i, r in enumerate([Q, H, Q]):
        q.arrive(claim(f"w{i}", r, at=i))
    assert q.withdraw("w0") is True
    assert q.withdraw("w0") is False
    assert q.withdraw("running") is False  # running claims depart, they are not withdrawn
    assert q.withdraw("nobody") is False
    got = [(e.claim, e.position, e.product_position) for e in q.explain(5)]
    assert got == [("w1", 1, 1), ("w2", 2, 1)]
    q.depart("running", 6)
    assert [a.claim for a in q.admit(6)] == ["w1", "w2"]
    assert "w0" not in ledger.allocations
    checked(q)


def test_withdraw_of_a_class_head_keeps_the_rest_of_the_class_in_order() -> None:
    q = queue(ledger_with(1), BEST_EFFORT_FIFO)
    for i in range(5):
        q.arrive(claim(f"q{i}", Q, at=i))
    q.withdraw("q0")
    q.withdraw("q2")
    assert [a.claim for a in q.admit(9)] == ["q1", "q3", "q4"]
    checked(q)


def test_duplicate_and_invalid_arrivals_are_refused_without_change() -> None:
    ledger = ledger_with(1)
    q = queue(ledger)
    q.arrive(claim("a", Q, at=0))
    with pytest.raises(QueueError, match="claim a is already waiting"):
        q.arrive(claim("a", H, at=1))
    q.admit(1)
    with pytest.raises(QueueError, match="claim a is already running"):
        q.arrive(claim("a", H, at=2))
    ledger.assign("outside", Q, "n0", ("n0-gpu0",))
    with pytest.raises(QueueError, match="already holds a slice on n0"):
        q.arrive(claim("outside", Q, at=2))
    with pytest.raises(QueueError, match="arrive takes a WaitingClaim"):
        q.arrive("b")  # type: ignore[arg-type]
    assert q.waiting() == 0 and q.running() == 1
    checked(q)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"claim": ""}, "non-empty claim id"),
        ({"arrived_at": float("nan")}, "arrived_at must be a finite number"),
        ({"priority": 1.5}, "priority must be an integer"),
        ({"time_limit": 0}, "time_limit must be a positive number"),
        ({"time_limit": float("inf")}, "time_limit must be a positive number"),
        ({"request": "v100-25"}, "request must be a packing.products.Request"),
    ],
)
def test_waiting_claim_validation(kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {"claim": "c", "namespace": "ns", "request": Q, "arrived_at": 0.0}
    args.update(kwargs)
    with pytest.raises(QueueError, match=message):
        WaitingClaim(**args)  # type: ignore[arg-type]


def test_waiting_claim_takes_arrival_and_priority_by_keyword_only() -> None:
    with pytest.raises(TypeError):
        WaitingClaim("c", "ns", Q, 0.0)  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"admission": "lottery"}, "unknown admission policy 'lottery'"),
        ({"age_limits": {"v100-25": -1}}, "age limit for v100-25"),
        ({"default_age_limit": float("nan")}, "age limit for default"),
        ({"reservation_ttl": 0}, "reservation_ttl must be a positive number"),
        ({"max_drain_targets": 0}, "max_drain_targets must be a whole number >= 1"),
    ],
)
def test_queue_configuration_is_validated(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(QueueError, match=message):
        ClaimQueue(ledger_with(1), **kwargs)  # type: ignore[arg-type]


def test_admission_policies_are_listed() -> None:
    assert ADMISSION_POLICIES[0] == AGING_GUARD == ClaimQueue(Ledger()).admission


def test_depart_releases_slice_and_usage() -> None:
    ledger = ledger_with(1)
    q = queue(ledger)
    q.arrive(claim("a", W, at=0))
    q.arrive(claim("b", H, at=1))
    q.admit(1)
    assert q.usage("team").slices == {"v100-100": 1}
    q.depart("a", 5)
    assert "a" not in ledger.allocations and q.usage("team").slices == {}
    assert [x.claim for x in q.admit(5)] == ["b"]
    with pytest.raises(UnknownClaimError, match="claim a is not running"):
        q.depart("a", 6)
    q.arrive(claim("c", W, at=7))
    with pytest.raises(QueueError, match="claim c is waiting, not running; use withdraw"):
        q.depart("c", 8)
    # a slice the extender already released is not released twice
    ledger.release("b")
    q.depart("b", 9)
    assert q.running() == 0
    checked(q)


def test_start_tracks_a_claim_placed_outside_the_queue() -> None:
    ledger = ledger_with(1)
    q = queue(ledger)
    q.set_entitlement("team", Entitlement({"v100-50": 1}))
    with pytest.raises(QueueError, match="holds no slice in the ledger"):
        q.start("rebuilt", "team", H, now=0)
    q.arrive(claim("waiting", H, at=0))
    ledger.assign("rebuilt", H, "n0", ("n0-gpu0",))
    q.start("rebuilt", "team", H, now=0, time_limit=100.0)
    assert q.usage("team").slices == {"v100-50": 1}
    assert q.admit(1) == []
    assert reasons(q, 1) == {"waiting": QUOTA_EXCEEDED}
    with pytest.raises(QueueError, match="already running"):
        q.start("rebuilt", "team", H, now=2)
    assert q.estimated_start(W, 2) == 100.0
    # a waiting claim that got bound some other way leaves the line
    ledger.assign("waiting", H, "n0", ("n0-gpu0",))
    q.start("waiting", "team", H, now=3)
    assert q.waiting() == 0 and q.usage("team").slices == {"v100-50": 2}
    checked(q)


def test_set_priority_moves_a_waiting_claim_keeping_its_arrival() -> None:
    ledger = ledger_with(1)
    q = queue(ledger)
    fill(q, ledger, [("running", W)])
    for i in range(3):
        q.arrive(claim(f"c{i}", H, at=i))
    q.set_priority("c2", 3)
    assert [c.claim for c in q.in_order()] == ["c2", "c0", "c1"]
    q.set_priority("c2", 0)
    assert [c.claim for c in q.in_order()] == ["c0", "c1", "c2"]
    q.set_priority("running", 9)  # recorded, no effect on a running claim
    with pytest.raises(UnknownClaimError):
        q.set_priority("nobody", 1)
    with pytest.raises(QueueError, match="priority must be an integer"):
        q.set_priority("c0", "high")  # type: ignore[arg-type]
    checked(q)


def test_entitlement_validation() -> None:
    with pytest.raises(EntitlementError, match="not a whole number"):
        Entitlement({"v100-25": -1})
    with pytest.raises(EntitlementError, match="max_milli"):
        Entitlement(max_milli=True)
    caps = {"v100-25": 1}
    e = Entitlement(caps)
    caps["v100-25"] = 5
    assert e.max_slices == {"v100-25": 1}  # a private copy
    with pytest.raises(QueueError, match="must be an Entitlement"):
        ClaimQueue(Ledger()).set_entitlement("ns", {"v100-25": 1})  # type: ignore[arg-type]


def test_requests_without_a_product_name_are_counted_by_size() -> None:
    ledger = ledger_with(1)
    q = queue(ledger)
    raw = Request(milli=250, memory_mib=8192)
    q.set_entitlement("team", Entitlement({"250-milli": 1}))
    q.arrive(claim("a", raw, at=0))
    q.arrive(claim("b", raw, at=1))
    assert [x.claim for x in q.admit(2)] == ["a"]
    [e] = q.explain(2)
    assert (e.product, e.reason) == ("250-milli", QUOTA_EXCEEDED)


def test_explanation_is_json_ready() -> None:
    ledger = ledger_with(1)
    q = queue(ledger)
    fill(q, ledger, [("running", W)])
    q.arrive(claim("a", H, at=0, priority=2))
    [e] = q.explain(30)
    doc = json.loads(json.dumps(e.as_dict()))
    assert doc == {"claim": "a", "namespace": "team", "product": "v100-50", "position": 1, "product_position": 1,
                   "reason": NO_CAPACITY, "message": e.message, "waited": 30, "priority": 2,
                   "estimated_start": None}


def test_explain_limit_returns_the_first_claims_with_their_global_positions() -> None:
    ledger = ledger_with(1)
    q = queue(ledger)
    fill(q, ledger, [("running", W)])
    for i, r in enumerate([Q, H, Q, W]):
        q.arrive(claim(f"c{i}", r, at=i))
    full = q.explain(10)
    assert q.explain(10, limit=2) == full[:2]
    assert q.explain(10, limit=0) == []
    assert q.explain(10, limit=99) == full
    with pytest.raises(QueueError, match="limit must be a whole number"):
        q.explain(10, limit=-1)


def test_now_must_be_finite() -> None:
    q = queue(ledger_with(1))
    for op in (q.admit, q.explain):
        with pytest.raises(QueueError, match="now must be a finite number"):
            op(float("nan"))


def test_other_placement_policies_drive_the_queue() -> None:
    from packing.policies import POLICIES

    for policy in POLICIES.values():
        ledger = ledger_with(2, 2)
        q = ClaimQueue(ledger, policy=policy)
        for i, r in enumerate([Q, W, H, Q, W, W, H]):
            q.arrive(claim(f"c{i}", r, at=i))
        admitted = q.admit(10)
        assert sum(a.allocation.request.milli for a in admitted) <= 4000
        assert [e.reason for e in q.explain(10)] == [NO_CAPACITY] * q.waiting()
        checked(q)
    assert BEST_FIT.name == "best-fit"
