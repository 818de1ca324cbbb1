"""Pod groups in the claim queue under random events (hypothesis stateful test).

A machine drives a ``ClaimQueue`` with a reservation TTL through arrivals of single claims and of
group members (now and then one that disagrees on its group's size), deletions, binds, failed
binds, departures and time passing, under every admission strategy, and checks after every step,
independently of the queue's code:

* **never a partial admission**: a step admits every waiting member of a group or none of them;
* **never a partial hold**: no member admitted with others of its group holds only a reservation
  while one of those waits: a lapsed, failed or deleted member takes every reserved member of its
  group back in line (released);
* **reservations released on timeout**: no reservation outlives the queue's TTL, and a member whose
  reservation lapsed is back in line (with its group) or admitted afresh, whole, in that step;
* **no deadlock**: whenever nothing holds any capacity, a step starts something if a complete,
  valid group or a claim that could ever fit waits within its entitlement -- two groups that could
  each run alone never wait for each other;
* every waiting claim is explained exactly once, a group's members with their group's reason,
  position and (name, present, size); the queue's and the ledger's own indexes stay consistent.
"""

from __future__ import annotations

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from packing.entitlements import Entitlement
from packing.group_fit import group_could_hold
from packing.ledger import Ledger
from packing.products import Request, load_catalog
from packing.queue import (
    ADMISSION_POLICIES,
    INVALID_GROUP,
    REASONS,
    UNSATISFIABLE,
    WAITING_FOR_MEMBERS,
    ClaimQueue,
    MemberOf,
    WaitingClaim,
)

CATALOG = load_catalog()
SHAPES = [CATALOG.request("v100-25"), CATALOG.request("v100-50"), CATALOG.request("v100-100"),
          CATALOG.request("v100-100", count=2)]
TTL = 30.0
GROUPS = ("a", "b", "c")


class GroupMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.n = 0
        self.groups: dict[str, tuple[int, Request]] = {}  # group name -> (size, member request) when first seen
        self.cohort: dict[str, frozenset[str]] = {}  # a group's member -> the members admitted in the same step

    @initialize(nodes=st.lists(st.integers(1, 4), min_size=1, max_size=3),
                admission=st.sampled_from(ADMISSION_POLICIES), capped=st.booleans())
    def setup(self, nodes: list[int], admission: str, capped: bool) -> None:
        self.ledger = Ledger()
        for i, cards in enumerate(nodes):
            self.ledger.add_node(f"n{i}", [(f"n{i}-g{j}", "Tesla-V100-SXM2-32GB", 32768) for j in range(cards)])
        self.q = ClaimQueue(self.ledger, admission=admission, reservation_ttl=TTL,
                            age_limits={"v100-25": 0.0, "v100-50": 60.0, "v100-100": 0.0})
        if capped:
            self.q.set_entitlement("team", Entitlement({"v100-100": 3}))

    # ---- events ------------------------------------------------------------------------------

    @rule(shape=st.sampled_from(SHAPES))
    def single(self, shape: Request) -> None:
        self.n += 1
        self.q.arrive(WaitingClaim(f"s{self.n}", "team", shape, arrived_at=self.now))

    @rule(group=st.sampled_from(GROUPS), size=st.integers(1, 4), shape=st.sampled_from(SHAPES[:3]),
          odd=st.integers(0, 9))
    def member(self, group: str, size: int, shape: Request, odd: int) -> None:
        known = self.groups.setdefault(group, (size, shape))
        size = size if odd == 0 else known[0]  # now and then a member disagrees on the size
        self.n += 1
        self.q.arrive(WaitingClaim(f"{group}{self.n}", "team", known[1], arrived_at=self.now,
                                   group=MemberOf(group, size)))

    @rule(data=st.data())
    def delete_waiting(self, data: st.DataObject) -> None:
        waiting = [w.claim for w in self.q.in_order()]
        if waiting:
            assert self.q.withdraw(data.draw(st.sampled_from(waiting)))

    @rule(data=st.data())
    def bind(self, data: st.DataObject) -> None:
        reserved = sorted(c for c, a in self.ledger.allocations.items() if a.reserved)
        if reserved:
            self.ledger.commit(data.draw(st.sampled_from(reserved)))

    @rule(data=st.data())
    def bind_fails(self, data: st.DataObject) -> None:
        reserved = sorted(c for c, a in self.ledger.allocations.items() if a.reserved)
        if reserved:
            self.q.requeue(data.draw(st.sampled_from(reserved)))
            self.check_no_partial_hold()

    @rule(data=st.data())
    def depart(self, data: st.DataObject) -> None:
        """A bound claim ends, or an admitted one's pod is deleted before its bind."""
        held = sorted(self.ledger.allocations)
        if held:
            released = self.q.depart(data.draw(st.sampled_from(held)), self.now)
            assert all(a.reserved for a in released)
            self.check_no_partial_hold()

    @rule(dt=st.sampled_from([1.0, 20.0, 45.0, 120.0]))
    def step(self, dt: float) -> None:
        self.now += dt
        before = {w.claim: w for w in self.q.in_order()}
        members_before: dict[str, set[str]] = {}
        for name, w in before.items():
            if w.group is not None:
                members_before.setdefault(w.group.name, set()).add(name)
        lapsed = {c for c, a in self.ledger.allocations.items()
                  if a.reserved and a.expires_at is not None and a.expires_at <= self.now}
        out = self.q.admit(self.now)
        got = {a.claim for a in out}
        assert len(got) == len(out), "a claim admitted twice"
        # reservations released on timeout: none outlives its TTL, and a lapsed one is back in line
        # (or admitted afresh in this very step, its group whole)
        for c, a in self.ledger.allocations.items():
            assert not a.reserved or a.expires_at is None or a.expires_at > self.now, f"{c}'s reservation outlived it"
        waiting_now = {w.claim for w in self.q.in_order()}
        assert all(c in waiting_now or c in got for c in lapsed), f"{sorted(lapsed - waiting_now - got)} lapsed, lost"
        if lapsed:
            event("a reservation lapsed")  # --hypothesis-show-statistics: how often the check had something to check
        for group, waiting in members_before.items():
            started = waiting & got
            assert not started or started == waiting, f"group {group}: {sorted(started)} of {sorted(waiting)} started"
            for m in started:
                self.cohort[m] = frozenset(started)
        self.check_no_partial_hold()
        if not self.ledger.allocations:
            assert not self.startable(), f"nothing holds any capacity and {self.startable()} waits: deadlock"

    # ---- checks ------------------------------------------------------------------------------

    def startable(self) -> list[str]:
        """Waiting claims or complete valid groups that an empty cluster holds, within the entitlement."""
        out: list[str] = []
        cap = self.q.entitlement("team")
        units: dict[str, list[WaitingClaim]] = {}
        for w in self.q.in_order():
            units.setdefault(w.group.name if w.group is not None else w.claim, []).append(w)
        for unit, claims in units.items():
            tag = claims[0].group
            if tag is not None:
                sizes = {w.group.size for w in claims if w.group is not None}
                running = [c for c in self.ledger.allocations if c.startswith(unit)]
                if len(sizes) != 1 or len(claims) + len(running) != tag.size:
                    continue
            requests = [w.request for w in claims]
            if group_could_hold(self.ledger, requests) is None:
                continue
            whole = sum(r.count for r in requests if r.product == "v100-100")
            if cap is not None and whole > cap.max_slices["v100-100"]:
                continue
            out.append(unit)
        return out

    def check_no_partial_hold(self) -> None:
        waiting = {w.claim for w in self.q.in_order()}
        for c, a in self.ledger.allocations.items():
            if a.reserved and c in self.cohort:
                back = self.cohort[c] & waiting
                assert not back, f"{c} holds a reservation while {sorted(back)}, admitted with it, waits"

    @invariant()
    def consistent(self) -> None:
        if not hasattr(self, "q"):
            return
        self.q.verify()
        self.ledger.verify()
        explained = self.q.explain(self.now)
        claims = [e.claim for e in explained]
        assert sorted(claims) == sorted(w.claim for w in self.q.in_order()), "explained != waiting"
        assert len(set(claims)) == len(claims)
        by_group: dict[str, set[tuple[str, int]]] = {}
        for e in explained:
            assert e.reason in REASONS
            w = self.q.claim(e.claim)
            if w.group is None:
                assert e.group is None and e.reason not in (WAITING_FOR_MEMBERS, INVALID_GROUP)
                continue
            assert e.group is not None and e.group.name == w.group.name
            by_group.setdefault(w.group.name, set()).add((e.reason, e.position))
            if e.reason == WAITING_FOR_MEMBERS:
                assert e.group.present < e.group.size
        for group, seen in by_group.items():
            assert len(seen) == 1, f"group {group}'s members explained differently: {seen}"
        assert all(e.reason != UNSATISFIABLE or e.group is not None or
                   group_could_hold(self.ledger, [self.q.claim(e.claim).request]) is None for e in explained)


GroupMachine.TestCase.settings = settings(max_examples=120, stateful_step_count=40, deadline=None)
test_groups_in_the_queue = GroupMachine.TestCase
