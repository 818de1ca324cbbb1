"""Pod groups in the admission step: the view that places a group as one unit, and the group front.

**One unit.** A group's entry (``packing.group_book``) sits in the waiting order with a
``GroupRequest`` (complete groups asking alike share one); ``GroupView`` is the strategies'
``AdmissionView`` that knows it:

* ``satisfiable`` (given by the queue): the group is complete and the cluster, empty, could hold
  every member at once (``group_fit.group_could_hold``); an incomplete or invalid group never fits,
  so it blocks nobody, not even under strict FIFO;
* ``over_entitlement``: every waiting member counted together against the namespace's entitlement;
* ``choose``: every member placed at once (``group_fit.place_group``), or None;
* ``admit``: every member reserved (or committed) in one step, the group's entry leaves the line and
  each member enters the running book; the strategy gets one ``Admission`` for the group, which the
  queue turns into one per member;
* the queue gives a group an infinite age limit, so no strategy makes it a head or backfills it:
  the group's bounded wait is the group front's.

**The group front** (``GroupFront``, under every strategy that ages claims, i.e. all but
best-effort-fifo and strict-fifo). Units starve in one order, singles and groups alike: by
priority, then the time they started to starve (arrival + T; a group's T is its members' least,
by the strategy's own age limits), then arrival order. When the first starving unit that needs a
GPU, could ever be held and is within its entitlement is a group, that group is the *front*, and
before the strategy's step it:

1. starts if its members fit now, anywhere (the policy's placement) or on its target;
2. otherwise holds its **target**: for each member, GPUs that, once the claims on them end, hold it
   (``group_fit.pick_group_target``, the likeliest to free soonest), picked when it became front
   and kept while its members are the same. The target's free capacity is held for the whole step
   (``packing.admission.holds``), so nothing else starts there; when its last claim ends the group
   starts there.

Then the next unit is the front. The bound this gives (``packing/QUEUE.md``, *Pod groups*) is
drain-soonest's, with a group counted as one unit: it holds for singles and groups in one
starving order, and it is checked against the simulation engine by
``tests/property/test_group_bounded_wait.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

from packing.admission.holds import Holds, fits_off
from packing.admission.view import AdmissionView
from packing.claims import Admission, QueueError, WaitingClaim
from packing.drain import claims_by_gpu, gpu_target
from packing.entitlements import product_name
from packing.explain import (
    ADMISSIBLE,
    BLOCKED_BY_HEAD_OF_LINE,
    FITS_NOW,
    INVALID_GROUP,
    NO_CAPACITY,
    QUOTA_EXCEEDED,
    UNSATISFIABLE,
    WAITING_FOR_MEMBERS,
    WAITING_FOR_RESERVATION,
    ClassFacts,
    Lens,
    span,
)
from packing.group_book import Group, GroupBook, GroupRequest
from packing.group_fit import (
    GroupChoice,
    Placement,
    fitting_members,
    group_could_hold,
    group_shortfall,
    pick_group_target,
    place_group,
    place_on_target,
)
from packing.ledger import Allocation, Ledger
from packing.policies import Choice, Policy
from packing.products import MILLI_PER_GPU, Request
from packing.running_book import RunningBook, RunningClaim
from packing.waiting_order import ClaimClass, Key, WaitingOrder

GROUP_HORIZON = 1800.0  # seconds: a group target's GPUs are scored by their chance to free within this


class GroupView(AdmissionView):
    """An ``AdmissionView`` that places a pod group's entry as all of its members at once."""

    def __init__(self, now: float, ledger: Ledger, policy: Policy, order: WaitingOrder, book: RunningBook,
                 reservation_ttl: float | None, satisfiable: Callable[[Request], bool],
                 age_limit: Callable[[str, Request], float], groups: GroupBook,
                 group_age_limit: Callable[[str, Request], float]) -> None:
        super().__init__(now, ledger, policy, order, book, reservation_ttl, satisfiable, age_limit)
        self.groups = groups
        self.group_age_limit = group_age_limit
        self.members: dict[str, list[Admission]] = {}  # group entry admitted this step -> its members' admissions
        # member sets that fit nowhere in this step (per set of nodes allowed): capacity only shrinks
        # within a step, so groups of the same members cost one placement attempt, as a request shape does
        self._misfit: set[tuple[frozenset[tuple[Request, int]], frozenset[str] | None]] = set()

    def over_entitlement(self, cls: ClaimClass) -> bool:
        r = cls.shape
        if not isinstance(r, GroupRequest):
            return super().over_entitlement(cls)
        ns = cls.namespace  # every group of the class asks alike in one namespace: one answer for all
        return group_shortfall(self.book.entitlement(ns), ns, r.member_requests(), self.book.usage(ns)) is not None

    def group_shortfall(self, g: Group) -> str | None:
        """Why the group's waiting members together would take their namespace over its entitlement."""
        ns = g.namespace
        return group_shortfall(self.book.entitlement(ns), ns, g.requests(), self.book.usage(ns))

    def choose(self, request: Request, nodes: Collection[str] | None = None) -> Choice | None:
        if not isinstance(request, GroupRequest):
            return super().choose(request, nodes)
        if request.members is None:
            return None  # waiting for members, or invalid
        key = (request.members, None if nodes is None else frozenset(nodes))
        if key in self._misfit:
            return None
        choice = place_group(self.policy, self.ledger, request.member_requests(), nodes)
        if choice is None:
            self._misfit.add(key)
        return choice

    def admit(self, name: str, choice: Choice, backfill: bool = False) -> Admission:
        g = self.groups.by_entry(name)
        if g is None:
            return super().admit(name, choice, backfill)
        if not isinstance(choice, GroupChoice):
            raise QueueError(f"{name} is a pod group: it is admitted with a GroupChoice of every member")
        return self.admit_group(g, choice.for_members(g.requests()))

    def admit_on(self, name: str, node: str, gpus: tuple[str, ...], backfill: bool = False) -> Admission:
        if self.groups.by_entry(name) is not None:
            raise QueueError(f"{name} is a pod group: a strategy never starts it on one node's GPUs")
        return super().admit_on(name, node, gpus, backfill)

    def admit_group(self, g: Group, placements: tuple[Placement, ...]) -> Admission:
        """Start every waiting member of ``g`` on its placement (member order), all or nothing."""
        members = g.members()
        if len(placements) != len(members):
            raise QueueError(f"pod group {g.label}: {len(placements)} placements for {len(members)} members")
        expires = self.now + self.reservation_ttl if self.reservation_ttl is not None else None
        done: list[Allocation] = []
        try:
            for w, (node, gpus) in zip(members, placements, strict=True):
                done.append(self.ledger.assign(w.claim, w.request, node, gpus, expires))
        except Exception:
            for a in done:
                self.ledger.release(a.claim)
            raise
        waited = max(0.0, self.now - g.arrived_at)
        seqs = {m: s for m, (_, s) in g.waiting.items()}
        self.order.remove(g.entry)
        out: list[Admission] = []
        for w, alloc in zip(members, done, strict=True):
            assert w.group is not None
            ends = self.now + self.slack + w.time_limit if w.time_limit is not None else None
            self.book.add(w.claim, RunningClaim(w.namespace, w.request, self.now, ends, w, seqs[w.claim]))
            self.groups.run(w.claim, w.namespace, w.group, self.now, seqs[w.claim])
            out.append(Admission(w.claim, alloc, waited, w.namespace))
        self.members[g.entry] = out
        return Admission(g.entry, done[0], waited, g.namespace)


# ---- the group front -------------------------------------------------------------------------------

StarveKey = tuple[int, float, int]  # (-priority, arrival + T, seq)


@dataclass(frozen=True, slots=True)
class GroupTarget:
    """The GPUs held for the front group: each waiting member's placement once they drain."""

    entry: str
    members: tuple[str, ...]  # the members it was picked for, in member order
    placements: tuple[Placement, ...]
    picked_at: float


def group_age_limit(view: GroupView, g: Group) -> float:
    """T of a group: the least, over its members' products, of the age limit the queue gives a
    group of that product: a product's own limit when one is set, else the default, else the
    strategy's for groups (drain-soonest: its limit for several cards, 4 h; worst-first: its hold
    clock's ceiling, 4 h), since a starving group holds several GPUs at once."""
    return min(view.group_age_limit(p, _several(p)) for p in g.facts().products)


def _several(product: str) -> Request:
    """A request of two whole cards counted under ``product``: what a group's age limit is asked for."""
    return Request(MILLI_PER_GPU, count=2, product=product)


def needs_gpu(g: Group) -> bool:
    return any(not r.gpu_less for r in g.requests())


class GroupFront:
    """The front group's target, kept across steps while it is the front and its members stay."""

    def __init__(self, horizon: float = GROUP_HORIZON) -> None:
        self.horizon = horizon
        self.target: GroupTarget | None = None

    def step(self, view: GroupView, holds: Holds) -> list[Admission]:
        """Before the strategy: start front groups that fit (each makes the next unit the front);
        hold the target of the first that does not. Returns the groups' admissions."""
        out: list[Admission] = []
        while True:
            g = self.front(view)
            if g is None:
                self.target = None
                return out
            choice = view.choose(g.entry_claim().request)
            target = self._target(view, g) if choice is None else None
            if target is not None:
                choice = place_on_target(view.ledger, g.requests(), target.placements)
            if choice is not None:
                assert isinstance(choice, GroupChoice)
                out.append(view.admit_group(g, choice.for_members(g.requests())))
                self.target = None
                continue
            if target is None:  # cannot happen for a satisfiable group; nothing to hold then
                self.target = None
                return out
            self.target = target
            for _, gpus in target.placements:
                for u in gpus:
                    holds.hold(u)
            return out

    def front(self, view: GroupView) -> Group | None:
        """The group at the front of the starving order, or None when that is a single claim (or nobody)."""
        now = view.now
        best: tuple[StarveKey, Group] | None = None
        limits: dict[frozenset[str], float] = {}
        for g in view.groups.waiting_groups():
            products = g.facts().products
            limit = limits.get(products)
            if limit is None:
                limit = limits[products] = group_age_limit(view, g)
            if now - g.arrived_at <= limit:
                continue  # not starving yet: the cheap test first, most groups stop here
            if g.entry not in view.order or not g.complete or not needs_gpu(g):
                continue
            if not view.satisfiable(g.entry_claim().request) or view.group_shortfall(g) is not None:
                continue
            key = (-g.priority, g.arrived_at + limit, g.seq)
            if best is None or key < best[0]:
                best = (key, g)
        if best is None:
            return None
        first = best[0]
        for cls in view.order.classes.values():  # a starving single ahead of it is the front instead
            r = cls.shape
            if isinstance(r, GroupRequest) or r.gpu_less:
                continue
            head: Key = cls.keys[0]
            limit = view.age_limit(product_name(r), r)
            if now - head[1] <= limit or (head[0], head[1] + limit, head[2]) >= first:
                continue
            if view.satisfiable(r) and not view.over_entitlement(cls):
                return None
        return best[1]

    def _target(self, view: GroupView, g: Group) -> GroupTarget | None:
        """The front's target: the one kept, while it is still for these members on GPUs they may use;
        else a fresh pick."""
        members = tuple(w.claim for w in g.members())
        t = self.target
        if t is not None and t.entry == g.entry and t.members == members and _still_there(view.ledger, g, t):
            return t
        requests = g.requests()
        on = claims_by_gpu(view.ledger)
        picked = pick_group_target(view.ledger, requests, view.book.runs, view.book.history, view.now,
                                   self.horizon, on) or group_could_hold(view.ledger, requests)
        return None if picked is None else GroupTarget(g.entry, members, picked, view.now)

    def held_for(self, entry: str) -> GroupTarget | None:
        """The target held for group ``entry`` in the last step, if it was the front."""
        return self.target if self.target is not None and self.target.entry == entry else None


def _still_there(ledger: Ledger, g: Group, t: GroupTarget) -> bool:
    for w, (node, gpus) in zip(g.members(), t.placements, strict=True):
        n = ledger.nodes.get(node)
        if n is None or not n.allows(w.request) or any(ledger.gpus.get(u) is None or ledger.gpus[u].node != node
                                                       for u in gpus):
            return False
    return True


# ---- explain -------------------------------------------------------------------------------------

def describe_members(requests: Collection[Request]) -> str:
    """``4 x v100-100`` or ``2 x v100-50, 1 x v100-25``."""
    counts: dict[str, int] = {}
    for r in requests:
        counts[r.describe()] = counts.get(r.describe(), 0) + 1
    return ", ".join(f"{n} x {what}" for what, n in counts.items())


FitMemo = dict[frozenset[tuple[Request, int]], tuple[bool, bool, int]]  # members -> (fit off held, fit, how many)


def group_facts(view: GroupView, g: Group, front: GroupFront, held_nodes: frozenset[str],
                satisfiable: bool, memo: FitMemo | None = None) -> tuple[ClassFacts, float | None]:
    """Why the group waits (one reason for all its members) and, for the front, its estimated start.
    ``memo`` keeps the fit checks of one explain pass: groups asking alike fit alike."""
    product = g.entry_claim().product
    requests = g.requests()
    nodes: frozenset[str] | None = None
    for r in requests:
        allowed = view.ledger.eligible(r)
        if allowed is None:
            nodes = None
            break
        nodes = allowed if nodes is None else nodes | allowed
    who = f"pod group {g.label} ({g.present} of {g.size} members present)"
    bad = g.invalid()
    if bad is not None:
        return ClassFacts(INVALID_GROUP, f"{who}: {bad}", False, product, nodes), None
    if g.present < g.size:
        waited = span(view.now - g.arrived_at)
        return ClassFacts(WAITING_FOR_MEMBERS, f"{who}: waits for its {g.size - g.present} missing member(s) "
                          f"({waited} since its first arrived); nothing of it starts until all {g.size} are here",
                          False, product, nodes), None
    what = f"{who} needs its {len(requests)} waiting member(s) ({describe_members(requests)}) placed at once"
    if not satisfiable:
        return ClassFacts(UNSATISFIABLE, f"{what}, each on a node it may use: the cluster could never hold them "
                          "all at once, even empty (re-checked when nodes join or change)", False, product, nodes), None
    quota = view.group_shortfall(g)
    if quota is not None:
        return ClassFacts(QUOTA_EXCEEDED, f"{who}: {quota}", False, product, nodes), None
    held = front.held_for(g.entry)
    if held is not None:
        on = claims_by_gpu(view.ledger)
        ends: list[float | None] = []
        where: dict[str, list[int]] = {}
        for r, (node, gpus) in zip(requests, held.placements, strict=True):
            t = gpu_target(view.ledger, r, node, gpus, on, view.book.runs, view.book.history, view.now, front.horizon)
            ends.append(t.drains_by)
            where.setdefault(node, []).extend(view.ledger.gpus[u].index for u in gpus)
        est = None if any(e is None for e in ends) else max(e for e in ends if e is not None)
        when = ("unknown: the claims there declare no time limit" if est is None
                else f"by {span(est - view.now)} from now")
        limit = group_age_limit(view, g)
        return ClassFacts(WAITING_FOR_RESERVATION, f"{what}; waited {span(view.now - g.arrived_at)}, past its "
                          f"{span(limit)} limit: holding {_where(where)} for it (nothing else starts "
                          f"there unless it ends first; freed, by declared ends, {when})", False, product, nodes), est
    memo = {} if memo is None else memo
    fits = memo.get(g.multiset())
    if fits is None:
        free = [n for n in view.ledger.nodes if n not in held_nodes]
        off_held = place_group(view.policy, view.ledger, requests, free if held_nodes else None) is not None
        anywhere = off_held or (bool(held_nodes) and place_group(view.policy, view.ledger, requests) is not None)
        k = 0 if anywhere else fitting_members(view.policy, view.ledger, list(requests))
        fits = memo[g.multiset()] = (off_held, anywhere, k)
    off_held, anywhere, k = fits
    if off_held:
        return ClassFacts(ADMISSIBLE, FITS_NOW, True, product, nodes), None
    if anywhere:
        return ClassFacts(BLOCKED_BY_HEAD_OF_LINE, f"{what}; they fit now only on capacity held for the head of "
                          f"the line (nodes {', '.join(sorted(held_nodes))})", False, product, nodes), None
    return ClassFacts(NO_CAPACITY, f"{what}, each on a node it may use; only {k} would fit now", False,
                      product, nodes), None


def _where(gpus: dict[str, list[int]]) -> str:
    """``GPUs 1, 3 of node n1 and GPU 0 of node n0``."""
    parts = []
    for node, indexes in gpus.items():
        cards = ", ".join(str(i) for i in sorted(set(indexes)))
        parts.append(f"GPU{'s' if len(set(indexes)) > 1 else ''} {cards} of node {node}")
    return " and ".join(parts)


class GroupLens:
    """The strategy's lens for single claims, and the group front's: a single claim that fits only on
    the GPUs held for the front group is blocked by it. A group's own reason is ``group_facts``'s."""

    def __init__(self, inner: Lens | None, view: GroupView, front: GroupFront) -> None:
        self.inner = inner
        self.view = view
        target = front.target
        self.front = view.groups.by_entry(target.entry) if target is not None else None
        self.held = frozenset(u for _, gpus in target.placements for u in gpus) if target is not None else frozenset()
        self._outside: dict[Request, bool] = {}

    def see(self, w: WaitingClaim, fit: bool, message: str) -> tuple[str, str, float | None] | None:
        if isinstance(w.request, GroupRequest):
            if not fit and self.inner is not None:  # the strategy sees a group that does not fit (strict FIFO's head)
                self.inner.see(w, fit, message)
            return None
        seen = self.inner.see(w, fit, message) if self.inner is not None else None
        if seen is not None or not fit or self.front is None or self._fits_outside(w.request):
            return seen
        g = self.front
        return BLOCKED_BY_HEAD_OF_LINE, (f"fits only on GPUs held for the head of the line, pod group {g.label} "
                                         f"({g.size} members, waited {span(self.view.now - g.arrived_at)})"), None

    def _fits_outside(self, r: Request) -> bool:
        """Does ``r`` fit now on GPUs the front group's target does not hold, on a node its pod may use?"""
        if r not in self._outside:
            self._outside[r] = fits_off(self.view.ledger, r, self.held)
        return self._outside[r]
