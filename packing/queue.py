"""The claim queue: who waits for a slice, in which order, why, and who is admitted next.

Quota is an entitlement, not a reservation: a valid claim that cannot get a slice now waits, and
is admitted as soon as one frees up; every waiting claim has exactly one reason and a position.
A claim is placed only on nodes its pod may use (``Request.constraints`` against each node's
labels, taints and cordon, ``packing.node_fit``). Pure logic over a ``Ledger``: the extender and
the simulator drive it through ``arrive``,
``withdraw``, ``start``, ``depart``, ``admit`` and ``explain``; it does no I/O and keeps no clock.

``ClaimQueue`` composes three parts, in the manner of Kueue's split of waiting, admitted and the loop:

* the waiting order (``packing.waiting_order``): priority (higher first), then arrival time (less
  a product's head start, a what-if of the simulator's; none in the extender), then arrival call
  order; stable and deterministic, indexed by class and request shape;
* the running and usage book (``packing.running_book``): the claims holding a slice, their declared
  ends, and each namespace's usage against its entitlement;
* one admission strategy (``packing.admission``, one module each, see ``packing/QUEUE.md``), whose
  ``step(view)`` decides each step's admissions.

The plain data (``WaitingClaim``, ``Admission``, policy names, errors) lives in ``packing.claims``,
the reasons and the explain pass in ``packing.explain``; both are re-exported here. Claims of a pod
group (``WaitingClaim.group``) wait as one unit, all admitted in one step or none
(``packing.group_line``: the group book, its one entry in line, its view and its front).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterator, Mapping
from dataclasses import replace
from typing import Literal

from packing.admission import Strategy, WorstFirstSettings, make_strategy
from packing.admission.holds import Holds
from packing.admission.view import choose_allowed
from packing.claims import (
    ADMISSION_POLICIES,
    AGING_GUARD,
    BEST_EFFORT_FIFO,
    DEFAULT_ADMISSION,
    DEFAULT_AGE_LIMIT,
    DEFAULT_DRAIN_TARGETS,
    DRAIN_SOONEST,
    STRICT_FIFO,
    WORST_FIRST,
    Admission,
    MemberOf,
    QueueError,
    UnknownClaimError,
    WaitingClaim,
)
from packing.claims import finite as _finite
from packing.claims import whole as _whole
from packing.drain import could_hold
from packing.entitlements import Entitlement, Usage
from packing.estimate import estimated_start
from packing.explain import (
    ADMISSIBLE,
    BLOCKED_BY_HEAD_OF_LINE,
    FITS_NOW,
    INVALID_GROUP,
    NO_CAPACITY,
    QUOTA_EXCEEDED,
    REASONS,
    UNSATISFIABLE,
    WAITING_FOR_MEMBERS,
    WAITING_FOR_RESERVATION,
    ClassFacts,
    Explanation,
    GroupStatus,
    capacity_message,
    explain_in_order,
    unsatisfiable_message,
)
from packing.group_admission import FitMemo, GroupLens, GroupView
from packing.group_book import Group, GroupRequest, is_entry
from packing.group_line import GroupLine
from packing.ledger import Allocation, Ledger, Node
from packing.policies import BEST_FIT, Policy
from packing.products import Request
from packing.running_book import RunningBook, RunningClaim
from packing.wait_history import WaitLately, kind_of
from packing.waiting_order import WaitingOrder

__all__ = [  # the queue's public names, wherever they are defined (the extender and simulator import them here)
    "ADMISSIBLE", "ADMISSION_POLICIES", "AGING_GUARD", "BEST_EFFORT_FIFO", "BLOCKED_BY_HEAD_OF_LINE",
    "DEFAULT_ADMISSION", "DEFAULT_AGE_LIMIT", "DEFAULT_DRAIN_TARGETS", "DRAIN_SOONEST", "INVALID_GROUP",
    "NO_CAPACITY", "QUOTA_EXCEEDED", "REASONS", "STRICT_FIFO", "UNSATISFIABLE", "WAITING_FOR_MEMBERS",
    "WAITING_FOR_RESERVATION", "WORST_FIRST", "Admission", "ClaimQueue", "Explanation", "GroupStatus", "MemberOf",
    "QueueError", "UnknownClaimError", "WaitingClaim", "WorstFirstSettings",
]


MAX_CACHED_SHAPES = 4096  # satisfiability memo entries (request shapes, node constraints included)
MAX_HEAD_START = 86400.0  # seconds: a head start beyond a day would let a product starve the others for long
NON_AGING = (BEST_EFFORT_FIFO, STRICT_FIFO)  # strategies that hold nothing for a starving claim, nor for a group


class ClaimQueue:
    """Waiting claims, the running claims it tracks, entitlements, and the admission step."""

    def __init__(
        self,
        ledger: Ledger,
        policy: Policy = BEST_FIT,
        admission: str = DEFAULT_ADMISSION,
        age_limits: Mapping[str, float] | None = None,
        reservation_ttl: float | None = None,
        default_age_limit: float | None = None,
        max_drain_targets: int | None = None,
        drain_horizon: float | None = None,
        head_starts: Mapping[str, float] | None = None,
        worst_first: WorstFirstSettings | None = None,
    ) -> None:
        if admission not in ADMISSION_POLICIES:
            raise QueueError(f"unknown admission policy {admission!r}; choose one of {', '.join(ADMISSION_POLICIES)}")
        limits = dict(age_limits or {})
        given = [("default", default_age_limit)] if default_age_limit is not None else []
        for product, limit in [*limits.items(), *given]:
            if not (_finite(limit) and limit >= 0):
                raise QueueError(f"age limit for {product} must be a finite number of seconds >= 0, got {limit!r}")
        if reservation_ttl is not None and not (_finite(reservation_ttl) and reservation_ttl > 0):
            raise QueueError(f"reservation_ttl must be a positive number of seconds or None, got {reservation_ttl!r}")
        if max_drain_targets is not None and not (_whole(max_drain_targets) and max_drain_targets >= 1):
            raise QueueError(f"max_drain_targets must be a whole number >= 1 or None, got {max_drain_targets!r}")
        if drain_horizon is not None and not (_finite(drain_horizon) and drain_horizon > 0):
            raise QueueError(f"drain_horizon must be a positive number of seconds or None, got {drain_horizon!r}")
        if worst_first is not None:
            worst_first.check()
        for kind, ahead in (head_starts or {}).items():
            if not (_finite(ahead) and abs(ahead) <= MAX_HEAD_START):
                raise QueueError(f"head start for {kind} must be a number of seconds within +-{MAX_HEAD_START:.0f}, "
                                 f"got {ahead!r}")
        self.ledger = ledger
        self.policy = policy
        self.admission = admission
        self.age_limits = limits
        self.default_age_limit = None if default_age_limit is None else float(default_age_limit)
        self.reservation_ttl = reservation_ttl
        self.strategy: Strategy = make_strategy(admission, max_drain_targets, drain_horizon, worst_first)
        self._seq = 0
        self._order = WaitingOrder(head_starts)
        self._book = RunningBook()
        self._holdable: dict[Request, tuple[bool, Node | None, int]] = {}
        self._groups = GroupLine(self._order, self._book, ledger)  # pod groups: members wait as one entry

    # ---- events ---------------------------------------------------------------------------------

    def arrive(self, claim: WaitingClaim) -> None:
        """Put ``claim`` in line; QueueError if the id is already waiting, running or holding a slice."""
        if not isinstance(claim, WaitingClaim):
            raise QueueError(f"arrive takes a WaitingClaim, got {type(claim).__name__}")
        self._refuse_known(claim.claim)
        held = self.ledger.allocations.get(claim.claim)
        if held is not None:
            raise QueueError(f"claim {claim.claim} already holds a slice on {held.node}; record it with start()")
        self._seq += 1
        if claim.group is not None:
            self._groups.arrive(claim, self._seq)
            return
        self._order.add(claim, self._seq)

    def withdraw(self, claim: str) -> bool:
        """Take a waiting claim out of line (its pod was deleted); False when it is not waiting. A pod
        group's member leaves its group, which keeps its place and waits for it again."""
        if self._groups.withdraw(claim):
            return True
        if claim not in self._order or is_entry(claim):
            return False
        self._order.remove(claim)
        return True

    def start(self, claim: str, namespace: str, request: Request, now: float, time_limit: float | None = None,
              group: MemberOf | None = None) -> None:
        """Track a claim that already holds its slice in the ledger (rebuilt from the API, or bound
        outside the queue), so its entitlement usage and declared end count. A waiting claim of
        that id leaves the line. Usage may exceed an entitlement this way; admission then waits.
        ``group``: its pod group (else the group it waited in), whose members present it counts in."""
        if not _finite(now):
            raise QueueError(f"now must be a finite number, got {now!r}")
        if time_limit is not None and not (_finite(time_limit) and time_limit > 0):
            raise QueueError(f"claim {claim}: time_limit must be a positive number of seconds or None")
        if claim in self._book:
            raise QueueError(f"claim {claim} is already running")
        if claim not in self.ledger.allocations:
            raise QueueError(f"claim {claim} holds no slice in the ledger; place it before start()")
        if group is not None and not isinstance(group, MemberOf):
            raise QueueError(f"claim {claim}: group must be a packing.claims.MemberOf or None")
        if is_entry(claim):
            raise QueueError(f"claim id {claim!r} is reserved for pod groups' places in line")
        member = self._groups.waiting_claim(claim)
        group = group if group is not None else member.group if member is not None else None
        if claim in self._order:
            self._order.remove(claim)
        self._seq += 1
        ends = now + time_limit if time_limit is not None else None
        self._book.add(claim, RunningClaim(namespace, request, now, ends, None, self._seq))
        if group is not None:
            self._groups.started(claim, namespace, group, now, self._seq)

    def depart(self, claim: str, now: float) -> list[Allocation]:
        """A running claim ended: release its slice (if the ledger still holds it) and its usage. A pod
        group's member takes its group's members that hold only a reservation back in line with it:
        their released allocations are returned (none for any other claim)."""
        if claim not in self._book:
            if self.state(claim) == "waiting":
                raise QueueError(f"claim {claim} is waiting, not running; use withdraw()")
            raise UnknownClaimError(f"claim {claim} is not running in this queue")
        if claim in self.ledger.allocations:
            self.ledger.release(claim)
        self._book.finish(claim, now)
        return self._groups.departed(claim)

    def requeue(self, claim: str) -> list[Allocation]:
        """Put an admitted claim back in line at its original place (its bind failed): its slice is
        released; a claim recorded with start() has no place to go back to (QueueError). A pod
        group's member goes back with every member of its group that is only reserved: their
        released allocations are returned."""
        run = self._book.get(claim)
        if run is None:
            raise UnknownClaimError(f"claim {claim} is not running in this queue")
        if run.origin is None:
            raise QueueError(f"claim {claim} was recorded with start(), not admitted; it has no place in line")
        if claim in self.ledger.allocations:
            self.ledger.release(claim)
        self._book.remove(claim)
        return self._back_in_line(claim, run)

    def _back_in_line(self, claim: str, run: RunningClaim) -> list[Allocation]:
        """An admitted claim, out of the running book, returns to its place; a pod group's member with
        its group's reserved members (whose released allocations are returned)."""
        assert run.origin is not None
        if run.origin.group is None:
            self._order.add(run.origin, run.seq)
            return []
        return self._groups.back_in_line(claim, run)

    def expire(self, now: float) -> list[Allocation]:
        """Cancel the ledger's lapsed reservations; the queue's own go back in line at their place (a pod
        group's member with its group's other reserved members, whose reservations end too).

        Returns every allocation released. ``admit`` calls this first.
        """
        expired = self.ledger.expire(now)
        for alloc in list(expired):
            run = self._book.get(alloc.claim)
            if run is None:
                continue
            self._book.remove(alloc.claim)
            if run.origin is not None:
                expired.extend(self._back_in_line(alloc.claim, run))
        return expired

    def set_priority(self, claim: str, priority: int) -> None:
        """Change a claim's priority; a waiting claim moves in line (keeping its arrival)."""
        if not _whole(priority):
            raise QueueError(f"priority must be an integer, got {priority!r}")
        if self._groups.set_priority(claim, priority):
            return
        entry = self._order.get(claim) if not is_entry(claim) else None
        run = self._book.get(claim)
        if entry is not None:
            waiting, key, _ = entry
            self._order.remove(claim)
            self._order.add(replace(waiting, priority=priority), key[2])
        elif run is not None:
            if run.origin is not None:
                run.origin = replace(run.origin, priority=priority)
        else:
            raise UnknownClaimError(f"claim {claim} is neither waiting nor running")

    def set_entitlement(self, namespace: str, entitlement: Entitlement | None) -> None:
        """Set (or with None, lift) a namespace's entitlement; it applies from the next step."""
        if entitlement is not None and not isinstance(entitlement, Entitlement):
            raise QueueError(f"entitlement must be an Entitlement or None, got {type(entitlement).__name__}")
        self._book.set_entitlement(namespace, entitlement)

    # ---- queries ----------------------------------------------------------------------------------

    def waiting(self) -> int:
        """How many claims wait (each member of a pod group counts)."""
        return self._groups.waiting(len(self._order))

    def running(self) -> int:
        """How many claims the queue tracks as holding a slice (admitted or started)."""
        return len(self._book)

    def classes(self) -> int:
        """Distinct (request, namespace, priority) classes waiting: what a step's cost grows with."""
        return len(self._order.classes)

    def state(self, claim: str) -> Literal["waiting", "running"] | None:
        """Where ``claim`` is: in line, holding a slice, or unknown to the queue (None)."""
        if (claim in self._order and not is_entry(claim)) or self._groups.waiting_claim(claim) is not None:
            return "waiting"
        return "running" if claim in self._book else None

    def claim(self, claim: str) -> WaitingClaim:
        """The waiting claim of that id (UnknownClaimError otherwise)."""
        member = self._groups.waiting_claim(claim)
        if member is not None:
            return member
        entry = self._order.get(claim) if not is_entry(claim) else None
        if entry is None:
            raise UnknownClaimError(f"claim {claim} is not waiting")
        return entry[0]

    def group_of(self, claim: str) -> Group | None:
        """The pod group of ``claim`` (waiting or running), None for a claim of no group (read it, do
        not change it)."""
        return self._groups.groups.of(claim)

    def groups(self) -> Iterator[Group]:
        """Every pod group the queue knows, waiting or running (read them, do not change them)."""
        return iter(self._groups.groups)

    def usage(self, namespace: str) -> Usage:
        """What ``namespace`` holds now (admitted and started claims)."""
        return self._book.usage(namespace)

    def entitlement(self, namespace: str) -> Entitlement | None:
        """The namespace's entitlement; None when it is not capped."""
        return self._book.entitlement(namespace)

    def in_order(self) -> Iterator[WaitingClaim]:
        """Waiting claims in queue order (a pod group's waiting members at their group's place)."""
        return self._groups.in_order(self._order.in_order())

    def age_limit(self, product: str, request: Request | None = None) -> float:
        """T for ``product``: once a claim has waited longer, it starves (the strategies that age act).
        Its own limit, else ``default_age_limit``, else the strategy's default for requests like
        ``request`` (``DEFAULT_AGE_LIMIT`` without one). A pod group's entry never starves in a
        strategy's eyes (infinite): the group front holds for it instead (``packing.group_admission``)."""
        if isinstance(request, GroupRequest):
            return math.inf
        limit = self.age_limits.get(product)
        if limit is not None:
            return limit
        if self.default_age_limit is not None:
            return self.default_age_limit
        return self.strategy.default_age_limit(request) if request is not None else DEFAULT_AGE_LIMIT

    def group_age_limit(self, product: str, request: Request) -> float:
        """T of a pod group asking ``product`` like ``request``: the product's own limit, else
        ``default_age_limit``, else the strategy's for groups."""
        limit = self.age_limits.get(product)
        if limit is not None:
            return limit
        if self.default_age_limit is not None:
            return self.default_age_limit
        return self.strategy.group_age_limit(request)

    def starving(self, claim: WaitingClaim, now: float) -> bool:
        """Has ``claim`` waited longer than its product's age limit?"""
        return now - claim.arrived_at > self.age_limit(claim.product, claim.request)

    def estimated_start(self, request: Request, now: float, nodes: Collection[str] | None = None) -> float | None:
        """When running claims' declared ends make ``request`` fit (on one of ``nodes`` when given;
        ``packing.estimate``)."""
        return estimated_start(self.ledger, request, self._book.ends, now, nodes)

    def drain_targets(self) -> dict[str, str]:
        """After the last step: each waiting claim the strategy holds capacity for -> the node held."""
        return {c: n for c, n in self.strategy.targets().items() if c in self._order}

    def view(self, now: float) -> GroupView:
        """The strategy's view of the queue at ``now`` (what ``admit`` and ``explain`` hand it); it
        places a pod group's entry as all its members at once."""
        if not _finite(now):
            raise QueueError(f"now must be a finite number, got {now!r}")
        return GroupView(now, self.ledger, self.policy, self._order, self._book, self.reservation_ttl,
                         self._satisfiable, self.age_limit, self._groups.groups, self.group_age_limit)

    # ---- the admission step ---------------------------------------------------------------------

    def admit(self, now: float) -> list[Admission]:
        """One admission step at ``now``: reserve (or commit) slices for the claims the strategy lets in.
        Under a strategy that ages claims, a starving pod group at the front of the line goes first
        (it starts, or the GPUs of its target are held for this step); a group's members are
        admitted together, one ``Admission`` each."""
        view = self.view(now)
        self.expire(now)
        holds = Holds(self.ledger)
        try:
            out = self._groups.front.step(view, holds) if self.admission not in NON_AGING else []
            out += self.strategy.step(view)
        finally:
            holds.release_all()
        return self._groups.members_of(view, out)

    # ---- explain ----------------------------------------------------------------------------------

    def explain(self, now: float, limit: int | None = None) -> list[Explanation]:
        """Every waiting claim in queue order (the first ``limit`` when set), with its position, one
        reason and what it waits for. A pod group counts as one unit (``limit`` too): each of its
        waiting members gets the group's reason and place, and ``group`` (name, present, size).

        Reasons describe what ``admit(now)`` does with the current ledger; call it right after
        ``admit(now)`` (then no claim is ``Admissible``). O(n) plus one fit check per class and one
        capacity message per request shape (``packing.explain``): meant for periodic condition
        refreshes and the state view, not for every scheduling event.
        """
        view = self.view(now)
        if limit is not None and (not isinstance(limit, int) or limit < 0):
            raise QueueError(f"limit must be a whole number >= 0 or None, got {limit!r}")
        fits: dict[Request, bool] = {}
        wants: dict[Request, str] = {}
        held = {n for c, n in self.strategy.targets().items() if c in self._order}
        front = self._groups.front.target
        if front is not None:
            held.update(node for node, _ in front.placements)
        estimates: dict[str, float | None] = {}
        group_fits: FitMemo = {}
        lately: dict[str, WaitLately | None] = {}

        def facts(w: WaitingClaim) -> ClassFacts:
            group = self._groups.facts(view, w, frozenset(held), estimates, group_fits)
            if group is not None:
                return group
            kind = kind_of(w.request)
            if kind not in lately:
                lately[kind] = self._book.waits.lately(kind)
            return self._class_facts(w, fits, wants)._replace(lately=lately[kind])

        lens = GroupLens(self.strategy.lens(view), view, self._groups.front)
        entries = self._groups.own_classes(self._order.ordered_entries(limit))
        return self._groups.expand(explain_in_order(entries, now, facts, lens), now, estimates)

    def _class_facts(self, w: WaitingClaim, fits: dict[Request, bool], wants: dict[Request, str]) -> ClassFacts:
        """What holds for every claim of ``w``'s class now: unsatisfiable, over quota, or does it fit?
        ``fits`` and ``wants`` memoise the fit check and the capacity message per request shape."""
        r = w.request
        product = w.product
        nodes = self.ledger.eligible(r)  # whom it competes with, for its position
        if not self._holds(r):
            return ClassFacts(UNSATISFIABLE, unsatisfiable_message(r, self.ledger), False, product, nodes)
        quota = self._book.shortfall(w.namespace, r)
        if quota is not None:
            return ClassFacts(QUOTA_EXCEEDED, quota, False, product, nodes)
        if r not in fits:
            fits[r] = choose_allowed(self.policy, self.ledger, r) is not None
        if fits[r]:
            return ClassFacts(ADMISSIBLE, FITS_NOW, True, product, nodes)
        if r not in wants:
            wants[r] = capacity_message(self.ledger, r)
        return ClassFacts(NO_CAPACITY, wants[r], False, product, nodes)

    # ---- satisfiability -----------------------------------------------------------------------

    def _satisfiable(self, r: Request) -> bool:
        """Could ``r`` ever be held: a pod group's entry all at once (``GroupLine.satisfiable``), else ``_holds``."""
        return self._groups.satisfiable(r) if isinstance(r, GroupRequest) else self._holds(r)

    def _holds(self, r: Request) -> bool:
        """Could some node ``r``'s pod may use hold ``r`` when empty? Cached per shape: a yes by the
        node that proved it (valid while that very node is in the ledger and still holds it), a no by
        the ledger's topology (valid until a node joins or changes labels, taints or cordon)."""
        cached = self._holdable.get(r)
        nodes = self.ledger.nodes
        if cached is not None:
            ok, witness, topology = cached
            if ok and witness is not None and nodes.get(witness.name) is witness and could_hold(witness, r):
                return True
            if not ok and topology == self.ledger.topology:
                return False
        if len(self._holdable) >= MAX_CACHED_SHAPES:
            self._holdable.clear()  # shapes multiply with node constraints: keep the memo bounded
        for node in nodes.values():
            if could_hold(node, r):
                self._holdable[r] = (True, node, self.ledger.topology)
                return True
        self._holdable[r] = (False, None, self.ledger.topology)
        return False

    # ---- bookkeeping -----------------------------------------------------------------------------

    def _refuse_known(self, claim: str) -> None:
        self._groups.refuse_known(claim)
        if claim in self._order:
            raise QueueError(f"claim {claim} is already waiting")
        if claim in self._book:
            raise QueueError(f"claim {claim} is already running")

    def verify(self) -> None:
        """Recompute every index from the claims; AssertionError names the first mismatch."""
        self._order.verify()
        self._book.verify()
        assert not set(self._order.entries) & set(self._book), "a claim both waits and runs"
        self._groups.verify(lambda m: m in self._book)
