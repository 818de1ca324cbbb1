"""Pod groups in the claim queue: one unit in line, all members admitted in one step or none."""

from __future__ import annotations

import pytest

from packing.entitlements import Entitlement
from packing.ledger import Ledger
from packing.products import Request
from packing.queue import (
    ADMISSION_POLICIES,
    BEST_EFFORT_FIFO,
    BLOCKED_BY_HEAD_OF_LINE,
    DRAIN_SOONEST,
    INVALID_GROUP,
    NO_CAPACITY,
    QUOTA_EXCEEDED,
    STRICT_FIFO,
    UNSATISFIABLE,
    WAITING_FOR_MEMBERS,
    WAITING_FOR_RESERVATION,
    ClaimQueue,
    MemberOf,
    QueueError,
    WaitingClaim,
)
from tests.unit.queue_helpers import H, Q, W, by_claim, checked, claim, ledger_with


def member(name: str, group: str, size: int, request: Request = W, at: float = 0.0, ns: str = "team",
           priority: int = 0, limit: float | None = None) -> WaitingClaim:
    return WaitingClaim(name, ns, request, arrived_at=at, priority=priority, time_limit=limit,
                        group=MemberOf(group, size))


def gang(q: ClaimQueue, group: str, size: int, request: Request = W, at: float = 0.0, ns: str = "team",
         present: int | None = None, priority: int = 0) -> list[str]:
    names = [f"{group}-{i}" for i in range(size if present is None else present)]
    for name in names:
        q.arrive(member(name, group, size, request, at, ns, priority))
    return names


def fillers(q: ClaimQueue, n: int, request: Request = W, at: float = 0.0) -> list[str]:
    names = [f"filler-{i}" for i in range(n)]
    for name in names:
        q.arrive(claim(name, request, at, ns="filler"))
    assert {a.claim for a in q.admit(at)} == set(names)
    return names


def admitted(q: ClaimQueue, now: float) -> set[str]:
    out = {a.claim for a in q.admit(now)}
    checked(q)
    return out


def test_four_and_three_whole_cards_on_three_free_cards_start_one_whole_group_and_explain_the_other() -> None:
    ledger = ledger_with(4, 4)
    q = ClaimQueue(ledger)
    fillers(q, 5)
    a = gang(q, "a", 4, at=1.0)
    b = gang(q, "b", 3, at=2.0)
    assert admitted(q, 3.0) == set(b)  # never three of a's four: a waits whole, b starts whole
    e = by_claim(q, 3.0)
    assert set(e) == set(a)
    assert {x.reason for x in e.values()} == {NO_CAPACITY}
    assert {x.position for x in e.values()} == {1}
    first = e[a[0]]
    assert first.group is not None and (first.group.name, first.group.present, first.group.size) == ("a", 4, 4)
    assert "pod group team/a (4 of 4 members present)" in first.message
    assert "4 x v100-100" in first.message and "only 0 would fit now" in first.message
    # a card frees: still one short; the fourth card starts all four in one step
    q.depart("filler-0", 10.0)
    assert admitted(q, 10.0) == set()
    assert "only 1 would fit now" in by_claim(q, 10.0)[a[0]].message
    for f in ("filler-1", "filler-2", "filler-3"):
        q.depart(f, 11.0)
    assert admitted(q, 11.0) == set(a)
    assert q.waiting() == 0 and q.running() == 8


def test_every_member_is_reserved_in_one_step_and_a_lapsed_one_takes_the_whole_group_back() -> None:
    ledger = ledger_with(2, 2)
    q = ClaimQueue(ledger, reservation_ttl=30.0)
    names = gang(q, "g", 3)
    out = q.admit(1.0)
    assert {x.claim for x in out} == set(names)
    assert all(x.allocation.reserved and x.allocation.expires_at == 31.0 for x in out)
    ledger.commit(names[0])  # one member bound; the other two never were
    ledger.extend(names[1], 100.0)  # a later filter renewed one reservation: it goes back all the same
    released = q.expire(31.0)
    assert {x.claim for x in released} == {names[1], names[2]}
    assert q.state(names[0]) == "running" and q.state(names[1]) == q.state(names[2]) == "waiting"
    e = by_claim(q, 31.0)
    assert set(e) == {names[1], names[2]}
    assert all(x.group is not None and x.group.present == 3 for x in e.values())
    checked(q)
    # the rest of the group starts together when it fits again
    assert admitted(q, 32.0) == {names[1], names[2]}


def test_a_failed_bind_puts_every_reserved_member_back_at_the_groups_place() -> None:
    ledger = ledger_with(2, 2)
    q = ClaimQueue(ledger, reservation_ttl=30.0)
    q.arrive(claim("before", Request(1000, 32768, count=3, product="v100-100"), 0.0))  # fits no node: waits
    names = gang(q, "g", 2, at=1.0)
    q.arrive(claim("after", Q, 2.0))
    assert admitted(q, 3.0) == {*names, "after"}
    q.requeue(names[1])
    assert q.state(names[0]) == q.state(names[1]) == "waiting"
    assert names[0] not in ledger.allocations and names[1] not in ledger.allocations
    assert [w.claim for w in q.in_order()] == ["before", *names]
    checked(q)


def test_a_member_deleted_while_waiting_leaves_the_group_waiting_for_it_at_its_place() -> None:
    ledger = ledger_with(2)
    q = ClaimQueue(ledger)
    fillers(q, 2)
    names = gang(q, "g", 2, at=1.0)
    q.arrive(claim("later", W, 2.0))
    assert q.withdraw(names[1]) is True
    e = by_claim(q, 5.0)
    assert e[names[0]].reason == WAITING_FOR_MEMBERS and "1 missing member" in e[names[0]].message
    assert e[names[0]].group is not None and (e[names[0]].group.present, e[names[0]].group.size) == (1, 2)
    assert e[names[0]].position == 1 and e["later"].position == 2
    q.depart("filler-0", 6.0)
    assert admitted(q, 6.0) == {"later"}  # an incomplete group blocks nobody
    q.arrive(member("g-new", "g", 2, at=7.0))  # its controller re-creates the member
    assert [w.claim for w in q.in_order()] == [names[0], "g-new"]
    q.depart("later", 8.0)
    assert admitted(q, 8.0) == set()  # two members, one free card
    e = by_claim(q, 8.0)
    assert e[names[0]].reason == NO_CAPACITY and "only 1 would fit now" in e[names[0]].message
    q.depart("filler-1", 9.0)
    assert admitted(q, 9.0) == {names[0], "g-new"}


@pytest.mark.parametrize("admission", ADMISSION_POLICIES)
def test_a_group_waiting_for_members_blocks_nobody_under_every_strategy(admission: str) -> None:
    q = ClaimQueue(ledger_with(2), admission=admission)
    gang(q, "g", 3, present=2)
    q.arrive(claim("single", W, 1.0))
    assert admitted(q, 2.0) == {"single"}
    assert {e.reason for e in q.explain(2.0)} == {WAITING_FOR_MEMBERS}


def test_strict_fifo_stops_at_a_complete_group_that_does_not_fit() -> None:
    q = ClaimQueue(ledger_with(2), admission=STRICT_FIFO)
    gang(q, "g", 3)
    q.arrive(claim("single", W, 1.0))
    assert admitted(q, 2.0) == {"single"}  # an unsatisfiable group blocks nobody either
    assert by_claim(q, 2.0)["g-0"].reason == UNSATISFIABLE  # three whole cards at once on two cards
    q2 = ClaimQueue(ledger_with(2, 2), admission=STRICT_FIFO)
    fillers(q2, 2)
    gang(q2, "g", 3, at=1.0)
    q2.arrive(claim("single", W, 2.0))
    assert admitted(q2, 3.0) == set()
    assert by_claim(q2, 3.0)["single"].reason == BLOCKED_BY_HEAD_OF_LINE


def test_members_disagreeing_on_the_size_make_an_invalid_group_until_the_odd_one_goes() -> None:
    q = ClaimQueue(ledger_with(4))
    q.arrive(member("a", "g", 2))
    q.arrive(member("b", "g", 2))
    q.arrive(member("c", "g", 3))
    assert admitted(q, 1.0) == set()
    e = by_claim(q, 1.0)
    assert {x.reason for x in e.values()} == {INVALID_GROUP}
    assert "disagree" in e["a"].message and "2 say 2, 1 say 3" in e["a"].message
    q.withdraw("c")
    assert admitted(q, 2.0) == {"a", "b"}


def test_a_group_no_empty_cluster_could_hold_is_unsatisfiable() -> None:
    q = ClaimQueue(ledger_with(2, 2))
    gang(q, "g", 2, Request(1000, 32768, count=2, product="v100-100"))  # two 2-card members: fits
    gang(q, "h", 3, Request(1000, 32768, count=2, product="v100-100"), at=1.0)  # three: never
    assert admitted(q, 1.0) == {"g-0", "g-1"}
    e = by_claim(q, 1.0)
    assert {x.reason for x in e.values()} == {UNSATISFIABLE}
    assert "could never hold them all at once" in e["h-0"].message


def test_the_whole_group_counts_against_its_namespaces_entitlement() -> None:
    q = ClaimQueue(ledger_with(4))
    q.set_entitlement("team", Entitlement({"v100-100": 3}))
    gang(q, "g", 2)
    gang(q, "h", 2, at=1.0)
    q.arrive(claim("one", W, 2.0))
    assert admitted(q, 3.0) == {"g-0", "g-1", "one"}  # h's two would take team to 4 of 3
    e = by_claim(q, 3.0)
    assert e["h-0"].reason == QUOTA_EXCEEDED and "its group needs 2 more at once" in e["h-0"].message
    q2 = ClaimQueue(ledger_with(4))
    q2.set_entitlement("team", Entitlement({"v100-100": 1}))
    gang(q2, "g", 2)
    assert admitted(q2, 1.0) == set()
    assert "can never start under this entitlement" in by_claim(q2, 1.0)["g-0"].message


def test_members_may_use_only_their_own_nodes() -> None:
    from packing.node_fit import NodeConstraints
    ledger = Ledger()
    ledger.add_node("a", [("a-0", "Tesla-V100-SXM2-32GB", 32768)], labels={"pool": "a"})
    ledger.add_node("b", [("b-0", "Tesla-V100-SXM2-32GB", 32768), ("b-1", "Tesla-V100-SXM2-32GB", 32768)],
                    labels={"pool": "b"})
    pinned = Request(1000, 32768, product="v100-100", constraints=NodeConstraints(node_selector=(("pool", "a"),)))
    q = ClaimQueue(ledger)
    q.arrive(member("x", "g", 2, pinned))
    q.arrive(member("y", "g", 2, pinned))
    assert admitted(q, 1.0) == set()  # two members pinned to a one-card pool
    assert by_claim(q, 1.0)["x"].reason == UNSATISFIABLE
    q.withdraw("y")
    q.arrive(member("y", "g", 2, W))
    got = q.admit(2.0)
    assert {(a.claim, a.allocation.node) for a in got} == {("x", "a"), ("y", "b")}


def test_priority_and_arrival_place_the_group_as_one_unit() -> None:
    q = ClaimQueue(ledger_with(2), admission=STRICT_FIFO)
    fillers(q, 2)
    q.arrive(claim("early", W, 1.0))
    gang(q, "g", 2, at=2.0, priority=5)
    q.arrive(claim("late", W, 3.0, priority=5))
    assert [w.claim for w in q.in_order()] == ["g-0", "g-1", "late", "early"]
    assert [e.position for e in q.explain(4.0)] == [1, 1, 2, 3]
    q.set_priority("g-1", 0)  # the group goes no sooner than its least urgent member
    assert [w.claim for w in q.in_order()] == ["late", "early", "g-0", "g-1"]
    checked(q)


def quarter_stream(q: ClaimQueue, group: list[str], until: float) -> float | None:
    """Two cards, four quarters each, one departing every 50 s and a new one arriving at once (best fit
    puts it in the slot just freed), each running 400 s: no card is ever empty by chance. Returns
    when the group started, None when it did not by ``until``."""
    ends: dict[str, float] = {}
    for i in range(8):
        q.arrive(claim(f"q{i}", Q, 0.0))
        ends[f"q{i}"] = 50.0 * (i + 1)
    assert len(q.admit(0.0)) == 8
    for name in group:
        q.arrive(member(name, "g", len(group), at=1.0))
    k = 8
    now = 0.0
    while now < until:
        now += 50.0
        for name in [n for n, t in ends.items() if t <= now]:
            q.depart(name, now)
            del ends[name]
            q.arrive(claim(f"q{k}", Q, now))
            k += 1
        got = admitted(q, now)
        if set(group) <= got:
            return now
        assert not set(group) & got, "part of a group started"
        for a in got:
            ends[a] = now + 400.0
        if now > 61.0 and q.admission == DRAIN_SOONEST:
            e = by_claim(q, now)[group[0]]
            assert e.reason == WAITING_FOR_RESERVATION and "holding GPU" in e.message, e.message
    return None


def test_a_starving_group_at_the_front_holds_its_target_and_a_stream_of_quarters_never_starves_it() -> None:
    limits = {"v100-100": 60.0, "v100-25": 0.0}
    started = quarter_stream(ClaimQueue(ledger_with(1, 1), admission=DRAIN_SOONEST, age_limits=limits), ["a", "b"],
                             3000.0)
    assert started is not None and started <= 1.0 + 60.0 + 400.0 + 50.0
    assert quarter_stream(ClaimQueue(ledger_with(1, 1), admission=BEST_EFFORT_FIFO), ["a", "b"], 3000.0) is None


def test_two_groups_that_could_each_run_alone_never_deadlock() -> None:
    ledger = ledger_with(2, 2)
    q = ClaimQueue(ledger)
    a = gang(q, "a", 3)
    b = gang(q, "b", 3, at=0.5)
    assert admitted(q, 1.0) == set(a)  # never two of each
    assert {ledger.allocations[m].node for m in a} <= {"n0", "n1"}
    for m in a:
        q.depart(m, 5.0)
    assert admitted(q, 5.0) == set(b)


def test_members_recorded_running_count_and_a_replacement_is_admitted_as_the_rest() -> None:
    ledger = ledger_with(2)
    q = ClaimQueue(ledger)
    ledger.assign("r0", W, "n0", ("n0-gpu0",))
    q.start("r0", "team", W, 0.0, group=MemberOf("g", 2))
    q.arrive(member("r1", "g", 2, at=5.0))
    e = by_claim(q, 5.0)
    assert e["r1"].group is not None and (e["r1"].group.present, e["r1"].group.size) == (2, 2)
    assert admitted(q, 5.0) == {"r1"}
    q.depart("r0", 6.0)
    q.depart("r1", 6.0)
    assert q.running() == 0 and q.waiting() == 0
    checked(q)


def test_group_entry_ids_are_not_claims() -> None:
    q = ClaimQueue(ledger_with(1))
    gang(q, "g", 2, present=1)
    assert q.withdraw("pod-group team/g") is False
    assert q.state("pod-group team/g") is None
    with pytest.raises(QueueError, match="reserved for pod groups"):
        q.arrive(claim("pod-group team/x", W, 0.0))
    with pytest.raises(QueueError, match="already waiting"):
        q.arrive(member("g-0", "g", 2))
    assert q.claim("g-0").group == MemberOf("g", 2)
    with pytest.raises(QueueError, match="waiting, not running"):
        q.depart("g-0", 1.0)
    assert q.waiting() == 1
    checked(q)


def test_half_slices_of_a_group_may_share_a_card() -> None:
    q = ClaimQueue(ledger_with(1))
    names = gang(q, "g", 2, H)
    got = q.admit(0.0)
    assert {a.claim for a in got} == set(names) and {a.allocation.gpus for a in got} == {("n0-gpu0",)}


def test_a_member_deleted_before_its_bind_takes_the_reserved_rest_back() -> None:
    ledger = ledger_with(4)
    q = ClaimQueue(ledger, reservation_ttl=30.0)
    names = gang(q, "g", 3)
    assert admitted(q, 1.0) == set(names)
    ledger.commit(names[0])
    released = q.depart(names[2], 2.0)  # its pod was deleted after the gate was lifted
    assert {a.claim for a in released} == {names[1]}
    assert q.state(names[0]) == "running" and q.state(names[1]) == "waiting" and q.state(names[2]) is None
    e = by_claim(q, 2.0)[names[1]]
    assert e.reason == WAITING_FOR_MEMBERS and e.group is not None and (e.group.present, e.group.size) == (2, 3)
    checked(q)


def test_groups_asking_alike_share_one_shape_and_each_keeps_its_own_reason() -> None:
    ledger = ledger_with(2)
    q = ClaimQueue(ledger)
    fillers(q, 2)
    gang(q, "g", 2, at=1.0)
    gang(q, "h", 2, at=2.0)
    gang(q, "i", 3, at=3.0, present=1)
    assert q.classes() == 2  # g and h: one class (one shape, namespace, priority); i waits for members
    e = by_claim(q, 4.0)
    assert "pod group team/g" in e["g-0"].message and "pod group team/h" in e["h-0"].message
    assert (e["g-0"].position, e["h-0"].position, e["i-0"].position) == (1, 2, 3)
    assert e["i-0"].reason == WAITING_FOR_MEMBERS
    q.depart("filler-0", 5.0)
    q.depart("filler-1", 5.0)
    assert admitted(q, 5.0) == {"g-0", "g-1"}  # the first of the shape, then the shape is full
