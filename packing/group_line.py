"""The claim queue's pod groups: what ``ClaimQueue`` does with a claim that is one of a gang.

``ClaimQueue`` keeps members out of its waiting order and hands them here (one hook per event):

* ``arrive``: the member waits in its group (``packing.group_book``); the group's one entry in the
  waiting order is put in line, or moved, to say what its members now are;
* ``withdraw`` (a waiting member's pod was deleted): it leaves its group, which keeps its place and
  waits for the member again (``WaitingForMembers``): a group never shrinks silently;
* ``started`` / ``departed``: a member holds its slice (admitted, or recorded running) or ended;
* ``back_in_line``: a member's reservation lapsed or its bind failed; every member of its group
  still only *reserved* goes back with it (their reservations released), so a group is never
  half-reserved: it waits again, at its place, for all its waiting members to fit at once;
* ``members_of``: the strategy's one admission of a group becomes one per member;
* ``explain``: every waiting member gets its group's reason and place, and the group's name,
  members present and size.

Invariants (``verify``): members are never in the waiting order; a group's entry is in line
exactly while it has a waiting member; every running member is in the running book.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace

from packing.claims import Admission, MemberOf, QueueError, WaitingClaim
from packing.explain import ClassFacts, Explanation, GroupStatus
from packing.group_admission import FitMemo, GroupFront, GroupView, group_facts
from packing.group_book import Group, GroupBook, GroupRequest, is_entry
from packing.group_fit import group_could_hold
from packing.ledger import Allocation, Ledger
from packing.products import Request
from packing.running_book import RunningBook, RunningClaim
from packing.waiting_order import Entry, WaitingOrder

MAX_CACHED_GROUPS = 4096  # satisfiability memo entries (distinct member sets)


class GroupLine:
    """The queue's pod groups over its waiting order, running book and ledger."""

    def __init__(self, order: WaitingOrder, book: RunningBook, ledger: Ledger) -> None:
        self.order = order
        self.book = book
        self.ledger = ledger
        self.groups = GroupBook()
        self.front = GroupFront()
        self._holdable: dict[tuple[frozenset[tuple[Request, int]], int], bool] = {}

    def __contains__(self, claim: object) -> bool:
        return claim in self.groups

    # ---- events --------------------------------------------------------------------------------

    def arrive(self, claim: WaitingClaim, seq: int) -> None:
        """``claim`` (a member) waits in its group."""
        self._reenter(self.groups.wait(claim, seq))

    def withdraw(self, claim: str) -> bool:
        """A waiting member leaves (its pod was deleted); False when it is not a waiting member."""
        g = self.groups.of(claim)
        if g is None or claim not in g.waiting:
            return False
        self.groups.leave(claim)
        self._reenter(g)
        return True

    def waiting_claim(self, claim: str) -> WaitingClaim | None:
        """The claim of a waiting member; None for anything else."""
        g = self.groups.of(claim)
        return g.waiting[claim][0] if g is not None and claim in g.waiting else None

    def started(self, claim: str, namespace: str, tag: MemberOf, now: float, seq: int) -> None:
        """``claim`` holds its slice, recorded by ``ClaimQueue.start`` (it may have waited in its group)."""
        self._reenter(self.groups.run(claim, namespace, tag, now, seq))

    def departed(self, claim: str) -> list[Allocation]:
        """A running member ended or was deleted (nothing for a claim of no group). Members of its
        group that hold only a reservation go back in line (returned, released): without it, the
        group cannot start whole."""
        g = self.groups.leave(claim)
        if g is None:
            return []
        released = self._unreserve(g)
        self._reenter(g)
        return released

    def set_priority(self, claim: str, priority: int) -> bool:
        """A waiting member's priority changed: its group's priority may move. False: no waiting member."""
        w = self.waiting_claim(claim)
        if w is None:
            return False
        self._reenter(self.groups.replace(replace(w, priority=priority)))
        return True

    def back_in_line(self, claim: str, run: RunningClaim) -> list[Allocation]:
        """The admitted member ``claim`` (already out of the running book, its slice released) goes
        back to its group's waiting members, and so does every other member of its group that holds
        only a reservation: their reservations are released and returned. Members already bound
        stay running; the group then waits for the rest at its place."""
        g = self.groups.of(claim)
        assert g is not None and run.origin is not None
        self.groups.back(run.origin, run.seq)
        released = self._unreserve(g)
        self._reenter(g)
        return released

    def _unreserve(self, g: Group) -> list[Allocation]:
        """Every member of ``g`` the queue admitted that holds only a reservation waits again (released)."""
        released: list[Allocation] = []
        for m in list(g.running):
            other = self.book.get(m)
            alloc = self.ledger.allocations.get(m)
            if other is None or other.origin is None or alloc is None or not alloc.reserved:
                continue
            released.append(self.ledger.release(m))
            self.book.remove(m)
            self.groups.back(other.origin, other.seq)
        return released

    def _reenter(self, g: Group) -> None:
        """Put ``g``'s entry in line as its members now are; out of line without a waiting member."""
        if g.entry in self.order:
            self.order.remove(g.entry)
        if g.waiting and self.groups.by_entry(g.entry) is g:
            self.order.add(g.entry_claim(), g.seq)

    # ---- the step --------------------------------------------------------------------------------

    def satisfiable(self, request: GroupRequest) -> bool:
        """Is it a complete group's shape, and could the cluster, empty, hold all those members at
        once? Memoised per member set until the ledger's topology changes."""
        if request.members is None:
            return False  # waiting for members, or invalid
        key = (request.members, self.ledger.topology)
        hit = self._holdable.get(key)
        if hit is None:
            if len(self._holdable) >= MAX_CACHED_GROUPS:
                self._holdable.clear()
            hit = self._holdable[key] = group_could_hold(self.ledger, request.member_requests()) is not None
        return hit

    def members_of(self, view: GroupView, admissions: list[Admission]) -> list[Admission]:
        """The step's admissions with each group's one admission replaced by its members'."""
        out: list[Admission] = []
        for a in admissions:
            out.extend(view.members[a.claim] if is_entry(a.claim) else (a,))
        return out

    # ---- queries -----------------------------------------------------------------------------------

    def waiting(self, in_order: int) -> int:
        """Claims waiting, given ``in_order`` entries in the waiting order (each group's counts once)."""
        return in_order - self.groups.lined() + self.groups.waiting_members()

    def in_order(self, entries: Iterator[WaitingClaim]) -> Iterator[WaitingClaim]:
        """Waiting claims in queue order: each group's entry is its waiting members."""
        for w in entries:
            g = self.groups.by_entry(w.claim) if is_entry(w.claim) else None
            if g is None:
                yield w
            else:
                yield from g.members()

    # ---- explain -------------------------------------------------------------------------------------

    @staticmethod
    def own_classes(entries: Iterator[Entry]) -> Iterator[Entry]:
        """``entries`` with each group's entry in a class of its own: groups asking alike share a class in
        the waiting order, but each has its own reason (its members present, its front's hold)."""
        for w, key, cid in entries:
            yield (w, key, -key[2]) if isinstance(w.request, GroupRequest) else (w, key, cid)

    def facts(self, view: GroupView, w: WaitingClaim, held_nodes: frozenset[str],
              estimates: dict[str, float | None], memo: FitMemo) -> ClassFacts | None:
        """The class facts of a group's entry (None for a single claim); its estimated start in ``estimates``;
        ``memo``: the pass's fit checks, per member set."""
        g = self.groups.by_entry(w.claim) if isinstance(w.request, GroupRequest) else None
        if g is None:
            return None
        assert isinstance(w.request, GroupRequest)
        f, est = group_facts(view, g, self.front, held_nodes, self.satisfiable(w.request), memo)
        estimates[g.entry] = est
        return f

    def expand(self, explained: list[Explanation], now: float,
               estimates: dict[str, float | None]) -> list[Explanation]:
        """Each group's explanation, as one per waiting member (its group's reason and place)."""
        out: list[Explanation] = []
        for e in explained:
            g = self.groups.by_entry(e.claim) if is_entry(e.claim) else None
            if g is None:
                out.append(e)
                continue
            status = GroupStatus(g.name, g.present, g.size)
            est = estimates.get(g.entry, e.estimated_start)
            for w in g.members():
                out.append(replace(e, claim=w.claim, product=w.product, waited=max(0.0, now - w.arrived_at),
                                   priority=w.priority, estimated_start=est, group=status))
        return out

    # ---- bookkeeping -----------------------------------------------------------------------------------

    def refuse_known(self, claim: str) -> None:
        if is_entry(claim):
            raise QueueError(f"claim id {claim!r} is reserved for pod groups' places in line")
        g = self.groups.of(claim)
        if g is not None and claim in g.waiting:
            raise QueueError(f"claim {claim} is already waiting (in pod group {g.label})")

    def verify(self, running: Callable[[str], bool]) -> None:
        """Members out of the waiting order, entries in line exactly while a member waits, running
        members in the running book; AssertionError names the first mismatch."""
        self.groups.verify()
        for g in self.groups:
            assert not any(m in self.order for m in (*g.waiting, *g.running)), f"a member of {g.label} is in line"
            assert (g.entry in self.order) == bool(g.waiting), f"group {g.label}: entry out of step"
            if g.entry in self.order:
                w, key, _ = self.order.entries[g.entry]
                assert w == g.entry_claim() and key[2] == g.seq, f"group {g.label}: stale entry"
            for m in g.running:
                assert running(m), f"member {m} of {g.label} runs but the running book lacks it"
        assert not any(is_entry(c) for c in self.order.entries if self.groups.by_entry(c) is None), \
            "an entry without its group"
