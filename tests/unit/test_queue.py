"""The claim queue, whatever its strategy: order, entitlements, each waiting reason, withdrawal and bookkeeping
(each admission strategy has its own ``test_queue_<strategy>.py``)."""

from __future__ import annotations

import json

import pytest

from packing.entitlements import Entitlement, EntitlementError
from packing.estimate import estimated_start
from packing.ledger import Ledger
from packing.policies import BEST_FIT
from packing.products import Request
from packing.queue import (
    ADMISSIBLE,
    ADMISSION_POLICIES,
    AGING_GUARD,
    BEST_EFFORT_FIFO,
    DRAIN_SOONEST,
    NO_CAPACITY,
    QUOTA_EXCEEDED,
    STRICT_FIFO,
    UNSATISFIABLE,
    WAITING_FOR_RESERVATION,
    WORST_FIRST,
    ClaimQueue,
    QueueError,
    UnknownClaimError,
    WaitingClaim,
    WorstFirstSettings,
)
from tests.unit.queue_helpers import (
    T4,
    V100,
    W2,
    H,
    Q,
    T,
    W,
    by_claim,
    checked,
    claim,
    fill,
    ledger_with,
    queue,
    reasons,
)

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


@pytest.mark.parametrize(
    ("head_starts", "order"),
    [
        ({}, ["h1", "q1", "h2", "q2"]),  # arrival order
        ({"v100-25": 8.0}, ["q1", "h1", "q2", "h2"]),  # quarters 8 s ahead: q1 (5 - 8) before h1 (0)
        ({"v100-50": -20.0}, ["q1", "q2", "h1", "h2"]),  # halves 20 s behind: after both quarters
        ({"v100-25": 100.0, "v100-50": 100.0}, ["h1", "q1", "h2", "q2"]),  # the same head start: arrival order
    ],
)
def test_head_starts_order_a_product_as_if_it_had_arrived_earlier(head_starts: dict[str, float],
                                                                   order: list[str]) -> None:
    ledger = ledger_with()  # no GPU: everything waits, in queue order
    q = queue(ledger, BEST_EFFORT_FIFO, head_starts=head_starts)
    for name, request, at in [("h1", H, 0), ("q1", Q, 5), ("h2", H, 10), ("q2", Q, 12)]:
        q.arrive(claim(name, request, at=at))
    assert [c.claim for c in q.in_order()] == order
    assert {e.claim: e.waited for e in q.explain(30)} == {"h1": 30, "q1": 25, "h2": 20, "q2": 18}  # true waits
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
        ({"max_drain_targets": 0}, "max_drain_targets must be a whole number >= 1 or None"),
        ({"head_starts": {"v100-50": 2 * 86400.0}}, "head start for v100-50 must be a number of seconds within"),
        ({"head_starts": {"v100-50": float("inf")}}, "head start for v100-50"),
        ({"admission": WORST_FIRST, "worst_first": WorstFirstSettings(hold_clock=-1.0)},
         "hold_clock must be a number of seconds >= 0"),
        ({"admission": WORST_FIRST, "worst_first": WorstFirstSettings(hold_clock=float("nan"))},
         "hold_clock must be a number of seconds >= 0"),
        ({"admission": WORST_FIRST, "worst_first": WorstFirstSettings(hold_share=0)},
         "hold_share must be a whole number >= 1"),
        # a field takes no None (only the whole settings do), and the message does not offer it
        ({"admission": WORST_FIRST, "worst_first": WorstFirstSettings(hold_share=None)},  # type: ignore[arg-type]
         r"hold_share must be a whole number >= 1, got None$"),
        ({"admission": WORST_FIRST, "worst_first": WorstFirstSettings(hold_idle=None)},  # type: ignore[arg-type]
         r"hold_idle must be a ratio > 0 \(inf: no limit by the hold clock\), got None$"),
        ({"admission": DRAIN_SOONEST, "worst_first": WorstFirstSettings(hold_share=8)},
         "worst-first's settings, not drain-soonest's"),
        ({"admission": DRAIN_SOONEST, "worst_first": WorstFirstSettings()},
         "worst-first's settings, not drain-soonest's"),
        ({"admission": WORST_FIRST, "worst_first": WorstFirstSettings(hold_within=0.0)},
         "hold_within must be a ratio > 0"),
        ({"admission": WORST_FIRST, "worst_first": WorstFirstSettings(hold_within=float("nan"))},
         "hold_within must be a ratio > 0"),
        ({"admission": DRAIN_SOONEST, "worst_first": WorstFirstSettings(hold_within=1.0)},
         "worst-first's settings, not drain-soonest's"),
        ({"admission": WORST_FIRST, "worst_first": WorstFirstSettings(front_share=0)},
         "front_share must be a whole number >= 1"),
        ({"admission": WORST_FIRST, "worst_first": WorstFirstSettings(front_share=True)},
         "front_share must be a whole number >= 1"),
        ({"admission": WORST_FIRST, "worst_first": WorstFirstSettings(front_worst="on")},  # type: ignore[arg-type]
         "front_worst must be True or False"),
        ({"admission": WORST_FIRST, "worst_first": WorstFirstSettings(single_front="mine")},
         "single_front must be one of own, sure, share"),
        ({"admission": DRAIN_SOONEST, "worst_first": WorstFirstSettings(front_share=8)},
         "worst-first's settings, not drain-soonest's"),
        ({"admission": WORST_FIRST, "worst_first": WorstFirstSettings(hold_idle=0.0)},
         "hold_idle must be a ratio > 0"),
        ({"admission": WORST_FIRST, "worst_first": WorstFirstSettings(hold_idle=float("nan"))},
         "hold_idle must be a ratio > 0"),
        ({"admission": DRAIN_SOONEST, "worst_first": WorstFirstSettings(hold_idle=2.0)},
         "worst-first's settings, not drain-soonest's"),
        ({"admission": WORST_FIRST, "worst_first": WorstFirstSettings(spare_window=0.0)},
         "spare_window must be a finite number of seconds > 0"),
        ({"admission": WORST_FIRST, "worst_first": WorstFirstSettings(spare_window=float("inf"))},
         "spare_window must be a finite number of seconds > 0"),
        ({"admission": DRAIN_SOONEST, "worst_first": WorstFirstSettings(spare_window=None)},
         "worst-first's settings, not drain-soonest's"),
    ],
)
def test_queue_configuration_is_validated(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(QueueError, match=message):
        ClaimQueue(ledger_with(1), **kwargs)  # type: ignore[arg-type]


def test_admission_policies_are_listed() -> None:
    assert ADMISSION_POLICIES[0] == WORST_FIRST == ClaimQueue(Ledger()).admission
    assert set(ADMISSION_POLICIES) == {WORST_FIRST, DRAIN_SOONEST, AGING_GUARD, BEST_EFFORT_FIFO, STRICT_FIFO}


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
                   "estimated_start": None, "group": None, "expected_in": None, "wait_lately": None}


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
        # under drain-soonest a whole card starves at once, so a waiting one may be a head
        explained = q.explain(10)
        assert len(explained) == q.waiting()
        heads = q.drain_targets()
        for e in explained:
            assert e.reason == (WAITING_FOR_RESERVATION if e.claim in heads else NO_CAPACITY), (policy, e)
        checked(q)
    assert BEST_FIT.name == "best-fit"
