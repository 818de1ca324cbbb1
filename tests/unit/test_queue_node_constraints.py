"""The queue and node constraints: it places a claim only on nodes its pod may use (labels, taints,
cordon), under every admission strategy; positions count only the claims that compete for a node."""

from __future__ import annotations

from dataclasses import replace

import pytest

from packing.node_fit import NO_SCHEDULE, NodeConstraints, Requirement, Taint, Term, Toleration
from packing.products import Request
from packing.queue import (
    ADMISSION_POLICIES,
    AGING_GUARD,
    BEST_EFFORT_FIFO,
    BLOCKED_BY_HEAD_OF_LINE,
    DRAIN_SOONEST,
    NO_CAPACITY,
    STRICT_FIFO,
    UNSATISFIABLE,
    WAITING_FOR_RESERVATION,
    ClaimQueue,
)
from tests.unit.queue_helpers import V100, Q, W, by_claim, checked, claim, fill, queue

ON_A = NodeConstraints(node_selector=(("pool", "a"),))
ON_B = NodeConstraints(affinity=(Term((Requirement("pool", "In", ("b",)),)),))


def on_node(name: str) -> NodeConstraints:
    return NodeConstraints(affinity=(Term((), (Requirement("metadata.name", "In", (name,)),)),))


def pinned(r: Request, c: NodeConstraints | None) -> Request:
    return replace(r, constraints=c)


def pools(a: int = 1, b: int = 1, cards: int = 1) -> ClaimQueue:
    """Nodes a0.. labelled pool=a and b0.. labelled pool=b, ``cards`` each (default strategy)."""
    from packing.ledger import Ledger

    ledger = Ledger()
    for pool, n in (("a", a), ("b", b)):
        for i in range(n):
            ledger.add_node(f"{pool}{i}", [(f"{pool}{i}-g{j}", V100, 32768) for j in range(cards)],
                            labels={"pool": pool})
    return ClaimQueue(ledger)


def test_an_empty_constraint_is_no_constraint() -> None:
    assert pinned(Q, NodeConstraints()) == Q
    assert pinned(Q, ON_A) != Q and hash(pinned(Q, ON_A)) == hash(pinned(Q, ON_A))


@pytest.mark.parametrize("admission", ADMISSION_POLICIES)
def test_a_claim_pinned_to_a_full_pool_waits_while_one_behind_it_goes_to_the_other(admission: str) -> None:
    q = pools()
    q = ClaimQueue(q.ledger, admission=admission, default_age_limit=600.0)
    fill(q, q.ledger, [("on-a", pinned(W, ON_A))])
    assert q.ledger.allocations["on-a"].node == "a0"
    q.arrive(claim("pinned", pinned(W, ON_A), at=1))
    q.arrive(claim("free", W, at=2))
    admitted = {a.claim: a.allocation.node for a in q.admit(3)}
    seen = by_claim(q, 3)
    if admission == STRICT_FIFO:  # strict FIFO: nothing overtakes the head, whatever nodes it may use
        assert admitted == {} and seen["free"].reason == BLOCKED_BY_HEAD_OF_LINE
    else:
        assert admitted == {"free": "b0"}
    assert seen["pinned"].reason == NO_CAPACITY
    assert "it may use 1 of 2 nodes (node selector pool=a)" in seen["pinned"].message
    checked(q)


@pytest.mark.parametrize("admission", ADMISSION_POLICIES)
def test_a_pinned_claim_is_only_placed_on_its_pool(admission: str) -> None:
    q = pools(a=1, b=2)
    q = ClaimQueue(q.ledger, admission=admission, default_age_limit=0.0)
    q.arrive(claim("to-b", pinned(Q, ON_B), at=0))
    q.arrive(claim("to-a", pinned(W, ON_A), at=1))
    q.arrive(claim("to-a2", pinned(Q, ON_A), at=2))
    admitted = {a.claim: a.allocation.node for a in q.admit(3)}
    assert admitted["to-b"].startswith("b") and admitted["to-a"] == "a0"
    assert "to-a2" not in admitted  # a0 is full; b0/b1 have room but it may not use them
    assert by_claim(q, 3)["to-a2"].reason in (NO_CAPACITY, WAITING_FOR_RESERVATION, BLOCKED_BY_HEAD_OF_LINE)
    for alloc in q.ledger.allocations.values():
        assert q.ledger.nodes[alloc.node].allows(alloc.request)
    checked(q)


@pytest.mark.parametrize("admission", ADMISSION_POLICIES)
def test_cordoned_nodes_take_no_new_reservations(admission: str) -> None:
    q = pools(a=1, b=1)
    q = ClaimQueue(q.ledger, admission=admission, default_age_limit=0.0)
    assert q.ledger.set_facts("b0", {"pool": "b"}, unschedulable=True)
    q.arrive(claim("x", W, at=0))
    q.arrive(claim("y", Q, at=1))
    tolerant = NodeConstraints(tolerations=(Toleration("node.kubernetes.io/unschedulable", "Exists", "", NO_SCHEDULE),))
    q.arrive(claim("daemon", pinned(Q, tolerant), at=2))
    admitted = {a.claim: a.allocation.node for a in q.admit(3)}
    assert admitted.get("x") == "a0" and "y" not in admitted
    if admission != STRICT_FIFO:
        assert admitted.get("daemon") == "b0"  # it tolerates the cordon
    checked(q)
    q.ledger.set_facts("b0", {"pool": "b"}, unschedulable=False)  # uncordoned: y goes there
    assert {a.claim: a.allocation.node for a in q.admit(4)}.get("y") == "b0"
    checked(q)


def test_a_cordoned_node_keeps_what_it_holds() -> None:
    q = pools(a=1, b=0)
    fill(q, q.ledger, [("run", Q)])
    q.ledger.set_facts("a0", {"pool": "a"}, unschedulable=True)
    assert "run" in q.ledger.allocations
    q.depart("run", 5)
    checked(q)


def test_untolerated_taints_keep_claims_off_and_tolerations_let_them_on() -> None:
    q = pools(a=1, b=1)
    q.ledger.set_facts("b0", {"pool": "b"}, taints=(Taint("nvidia.com/gpu", "present", NO_SCHEDULE),))
    q.arrive(claim("plain", W, at=0))
    q.arrive(claim("plain2", W, at=1))
    q.arrive(claim("tolerant", pinned(W, NodeConstraints(tolerations=(Toleration("nvidia.com/gpu", "Exists"),))),
                   at=2))
    admitted = {a.claim: a.allocation.node for a in q.admit(3)}
    assert admitted == {"plain": "a0", "tolerant": "b0"}
    assert by_claim(q, 3)["plain2"].reason in (NO_CAPACITY, WAITING_FOR_RESERVATION)
    checked(q)


def test_positions_count_only_claims_competing_for_the_same_nodes() -> None:
    q = pools(a=1, b=1)
    fill(q, q.ledger, [("fa", pinned(W, ON_A)), ("fb", pinned(W, ON_B))])
    q.arrive(claim("a1", pinned(W, ON_A), at=1))
    q.arrive(claim("b1", pinned(W, ON_B), at=2))
    q.arrive(claim("a2", pinned(Q, ON_A), at=3))
    q.arrive(claim("any", W, at=4))
    q.arrive(claim("b2", pinned(W, ON_B), at=5))
    q.admit(6)
    seen = by_claim(q, 6)
    assert {c: e.position for c, e in seen.items()} == {"a1": 1, "b1": 1, "a2": 2, "any": 4, "b2": 3}
    assert {c: e.product_position for c, e in seen.items()} == {"a1": 1, "b1": 1, "a2": 1, "any": 3, "b2": 3}
    checked(q)


def test_without_constraints_positions_are_one_to_n() -> None:
    q = pools(a=1, b=1)
    fill(q, q.ledger, [("f1", W), ("f2", W)])
    for i in range(4):
        q.arrive(claim(f"c{i}", W if i % 2 else Q, at=i + 1))
    q.admit(10)
    assert [e.position for e in q.explain(10)] == [1, 2, 3, 4]
    assert [e.product_position for e in q.explain(10)] == [1, 1, 2, 2]


def test_a_pool_no_node_has_is_unsatisfiable_until_a_node_is_labelled() -> None:
    q = pools(a=1, b=0)
    on_c = pinned(Q, NodeConstraints(node_selector=(("pool", "c"),)))
    q.arrive(claim("c", on_c, at=0))
    assert q.admit(1) == []
    e = by_claim(q, 1)["c"]
    assert e.reason == UNSATISFIABLE
    assert "may use none of the 1 GPU nodes (node selector pool=c): 1 do not match its node selector" in e.message
    q.ledger.set_facts("a0", {"pool": "c"})  # relabelled: the satisfiability memo must see it
    assert [a.allocation.node for a in q.admit(2)] == ["a0"]
    checked(q)


def test_an_unsatisfiable_message_names_cordons_and_taints() -> None:
    q = pools(a=2, b=0)
    q.ledger.set_facts("a0", {"pool": "a"}, unschedulable=True)
    q.ledger.set_facts("a1", {"pool": "a"}, taints=(Taint("maint", "", NO_SCHEDULE),))
    q.arrive(claim("x", Q, at=0))
    q.admit(1)
    message = by_claim(q, 1)["x"].message
    assert "1 are cordoned" in message and "1 have a NoSchedule/NoExecute taint it does not tolerate" in message


@pytest.mark.parametrize("admission", [DRAIN_SOONEST, AGING_GUARD])
def test_a_starving_pinned_claim_holds_capacity_only_in_its_pool(admission: str) -> None:
    q = pools(a=2, b=2, cards=1)
    q = ClaimQueue(q.ledger, admission=admission, default_age_limit=0.0)
    fill(q, q.ledger, [(f"q{n}", pinned(Q, on_node(n))) for n in ("a0", "a1", "b0", "b1")])
    # every card has a quarter: a whole card pinned to pool b starves and becomes a head
    q.arrive(claim("head", pinned(W, ON_B), at=1))
    q.admit(2)
    targets = q.drain_targets()
    assert targets.get("head", "").startswith("b")
    assert by_claim(q, 2)["head"].reason == WAITING_FOR_RESERVATION
    checked(q)


def test_drain_soonest_drops_a_target_whose_node_is_cordoned() -> None:
    q = pools(a=1, b=1, cards=1)
    fill(q, q.ledger, [("qa", pinned(Q, ON_A)), ("qb", pinned(Q, ON_B))])
    q.arrive(claim("head", W, at=1))
    q.admit(2)
    first = q.drain_targets()["head"]
    q.ledger.set_facts(first, {"pool": first[0]}, unschedulable=True)
    q.admit(3)
    assert q.drain_targets()["head"] != first
    q.depart("qa" if first == "a0" else "qb", 4)
    assert q.admit(5) == []  # the cordoned node freed, but the head may not go there
    checked(q)


def test_best_effort_and_strict_see_the_same_eligible_nodes() -> None:
    for admission in (BEST_EFFORT_FIFO, STRICT_FIFO):
        q = pools(a=1, b=1)
        q = queue(q.ledger, admission)
        q.arrive(claim("a", pinned(W, ON_A), at=0))
        q.arrive(claim("a2", pinned(W, ON_A), at=1))
        assert {a.claim: a.allocation.node for a in q.admit(2)} == {"a": "a0"}
        assert by_claim(q, 2)["a2"].reason == NO_CAPACITY


def test_a_cordon_is_named_when_it_is_what_limits_the_nodes() -> None:
    q = pools(a=1, b=1)
    fill(q, q.ledger, [("f", W)])
    q.ledger.set_facts("b0" if q.ledger.allocations["f"].node == "a0" else "a0", {}, unschedulable=True)
    everyday = NodeConstraints(tolerations=(Toleration("node.kubernetes.io/not-ready", "Exists", "", "NoExecute"),))
    q.arrive(claim("x", pinned(Q, everyday), at=1))
    q.admit(2)
    assert "it may use 1 of 2 nodes (the others are cordoned or tainted)" in by_claim(q, 2)["x"].message


def test_a_node_nobody_described_takes_any_pod() -> None:
    from packing.ledger import Ledger

    ledger = Ledger()
    ledger.add_node("seeded", [("s-g0", V100, 32768)], known=False)  # kube-scheduler knows its labels; we do not
    q = ClaimQueue(ledger)
    q.arrive(claim("x", pinned(Q, ON_A), at=0))
    assert [a.allocation.node for a in q.admit(1)] == ["seeded"]
    assert ledger.eligible(pinned(Q, ON_A)) is None
    ledger.set_facts("seeded", {"pool": "b"})  # now described: pool b only
    q.arrive(claim("y", pinned(Q, ON_A), at=2))
    assert q.admit(3) == [] and by_claim(q, 3)["y"].reason == UNSATISFIABLE
    checked(q)
