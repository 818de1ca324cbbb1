"""The claim queue: who waits for a slice, in which order, why, and who is admitted next.

Quota is an entitlement, not a reservation: a valid claim that cannot get a slice now waits, and
is admitted as soon as one frees up; every waiting claim has exactly one reason and a position.
Pure logic over a ``Ledger``: the extender and the simulator drive it through ``arrive``,
``withdraw``, ``start``, ``depart``, ``admit`` and ``explain``; it does no I/O and keeps no clock.

Order: priority (higher first), then arrival time, then arrival call order; stable and
deterministic. Admission policies (see ``packing/QUEUE.md`` for the rules and guarantees):

* ``best-effort-fifo``: in order, admit every claim that fits; one that does not fit blocks nobody;
* ``strict-fifo``: in order, stop at the first claim (within its entitlement) that does not fit;
* ``aging-guard`` (default): best effort, except that a claim that has waited longer than its
  product's age limit T and does not fit (a head, one per request shape, at most ``drain_cap()``)
  holds one node, its drain target (``packing.drain``): younger claims go anywhere else, and onto
  the target only when their declared time limit ends before the head's estimated start there.

Data structures (so that a step is not a re-sort of the whole queue): waiting claims sit in
classes of identical (request, namespace, priority), each a ``SortedList`` in arrival order; per
request shape, a ``SortedList`` of its class heads. A step merges shapes through a heap of their
next heads: a shape that does not fit is dropped at once with all its classes, a class over its
entitlement is skipped at once. A step where nothing fits costs O(shapes + blocked classes) x log,
whatever the number of waiting claims; each admission adds O(log n) plus the placement.

The plain data (``WaitingClaim``, ``Admission``, policy names, errors) lives in ``packing.claims``,
the reasons and the explain pass in ``packing.explain``; both are re-exported here.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from sortedcontainers import SortedList

from packing.claims import (
    ADMISSION_POLICIES,
    AGING_GUARD,
    BEST_EFFORT_FIFO,
    DEFAULT_AGE_LIMIT,
    DEFAULT_DRAIN_TARGETS,
    STRICT_FIFO,
    Admission,
    QueueError,
    UnknownClaimError,
    WaitingClaim,
)
from packing.claims import finite as _finite
from packing.drain import pick_target
from packing.entitlements import Entitlement, Usage, UsageBook, product_name, shortfall
from packing.estimate import estimated_start
from packing.explain import (
    ADMISSIBLE,
    BLOCKED_BY_HEAD_OF_LINE,
    FITS_NOW,
    NO_CAPACITY,
    QUOTA_EXCEEDED,
    REASONS,
    UNSATISFIABLE,
    WAITING_FOR_RESERVATION,
    ClassFacts,
    Explanation,
    capacity_message,
    explain_in_order,
    unsatisfiable_message,
)
from packing.ledger import Allocation, Ledger, Node
from packing.policies import BEST_FIT, Choice, Policy
from packing.products import Request

__all__ = [  # the queue's public names, wherever they are defined (the extender and simulator import them here)
    "ADMISSIBLE", "ADMISSION_POLICIES", "AGING_GUARD", "BEST_EFFORT_FIFO", "BLOCKED_BY_HEAD_OF_LINE",
    "DEFAULT_AGE_LIMIT", "DEFAULT_DRAIN_TARGETS", "NO_CAPACITY", "QUOTA_EXCEEDED", "REASONS", "STRICT_FIFO",
    "UNSATISFIABLE", "WAITING_FOR_RESERVATION", "Admission", "ClaimQueue", "Explanation", "QueueError",
    "UnknownClaimError", "WaitingClaim",
]

Key = tuple[int, float, int]  # (-priority, arrived_at, seq): queue order
Entry = tuple[WaitingClaim, Key, int]  # a waiting claim, its Key and its class id
_AFTER_KEYS = (math.inf,)  # compares above every Key: closes a (time limit, Key) range


@dataclass(slots=True)
class _Running:
    namespace: str
    request: Request
    started_at: float
    ends_at: float | None
    origin: WaitingClaim | None  # set when the queue admitted it: a lapsed reservation goes back in line
    seq: int


@dataclass(slots=True)
class _Class:
    cid: int
    shape: Request
    namespace: str
    priority: int
    keys: SortedList = field(default_factory=SortedList)  # Key, arrival order
    limits: SortedList = field(default_factory=SortedList)  # (time limit, Key) of claims declaring one


@dataclass(frozen=True, slots=True)
class _Head:
    """A starving head of the line in one step: the node held for it, and its estimated start there."""

    claim: WaitingClaim
    key: Key
    node: str
    est: float | None


@dataclass(slots=True)
class _Shape:
    sid: int
    request: Request
    heads: SortedList = field(default_factory=SortedList)  # (head Key, cid) of its classes
    by_age: SortedList = field(default_factory=SortedList)  # (arrived_at, head Key): is any head starving?


ClassKey = tuple[Request, str, int]


class ClaimQueue:
    """Waiting claims, the running claims it tracks, entitlements, and the admission step."""

    def __init__(
        self,
        ledger: Ledger,
        policy: Policy = BEST_FIT,
        admission: str = AGING_GUARD,
        age_limits: Mapping[str, float] | None = None,
        reservation_ttl: float | None = None,
        default_age_limit: float = DEFAULT_AGE_LIMIT,
        max_drain_targets: int = DEFAULT_DRAIN_TARGETS,
    ) -> None:
        if admission not in ADMISSION_POLICIES:
            raise QueueError(f"unknown admission policy {admission!r}; choose one of {', '.join(ADMISSION_POLICIES)}")
        limits = dict(age_limits or {})
        for product, limit in [*limits.items(), ("default", default_age_limit)]:
            if not (_finite(limit) and limit >= 0):
                raise QueueError(f"age limit for {product} must be a finite number of seconds >= 0, got {limit!r}")
        if reservation_ttl is not None and not (_finite(reservation_ttl) and reservation_ttl > 0):
            raise QueueError(f"reservation_ttl must be a positive number of seconds or None, got {reservation_ttl!r}")
        if not isinstance(max_drain_targets, int) or isinstance(max_drain_targets, bool) or max_drain_targets < 1:
            raise QueueError(f"max_drain_targets must be a whole number >= 1, got {max_drain_targets!r}")
        self.ledger = ledger
        self.policy = policy
        self.max_drain_targets = max_drain_targets
        self.admission = admission
        self.age_limits = limits
        self.default_age_limit = float(default_age_limit)
        self.reservation_ttl = reservation_ttl
        self._seq = 0
        self._waiting: dict[str, Entry] = {}  # claim id -> (claim, key, cid)
        self._by_seq: dict[int, Entry] = {}  # seq -> the same entry as in _waiting: one lookup per Key
        self._order: SortedList = SortedList()  # every waiting Key
        self._classes: dict[int, _Class] = {}
        self._class_of: dict[ClassKey, int] = {}
        self._shapes: dict[Request, _Shape] = {}
        self._next_id = 0
        self._limited_waiting = 0  # waiting claims that declare a time limit (backfill candidates)
        self._running: dict[str, _Running] = {}
        self._ends: SortedList = SortedList()  # (declared end, claim) of running claims
        self._usage = UsageBook()
        self._entitlements: dict[str, Entitlement] = {}
        self._holdable: dict[Request, tuple[bool, Node | None]] = {}
        self._targets: dict[str, str] = {}  # aging guard: starving head -> its drain target, kept across steps

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
        self._enqueue(claim, self._seq)

    def withdraw(self, claim: str) -> bool:
        """Take a waiting claim out of line (its pod was deleted); False when it is not waiting."""
        if claim not in self._waiting:
            return False
        self._dequeue(claim)
        return True

    def start(self, claim: str, namespace: str, request: Request, now: float, time_limit: float | None = None) -> None:
        """Track a claim that already holds its slice in the ledger (rebuilt from the API, or bound
        outside the queue), so its entitlement usage and declared end count. A waiting claim of
        that id leaves the line. Usage may exceed an entitlement this way; admission then waits."""
        if not _finite(now):
            raise QueueError(f"now must be a finite number, got {now!r}")
        if time_limit is not None and not (_finite(time_limit) and time_limit > 0):
            raise QueueError(f"claim {claim}: time_limit must be a positive number of seconds or None")
        if claim in self._running:
            raise QueueError(f"claim {claim} is already running")
        if claim not in self.ledger.allocations:
            raise QueueError(f"claim {claim} holds no slice in the ledger; place it before start()")
        if claim in self._waiting:
            self._dequeue(claim)
        self._seq += 1
        ends = now + time_limit if time_limit is not None else None
        self._track(claim, _Running(namespace, request, now, ends, None, self._seq))

    def depart(self, claim: str, now: float) -> None:
        """A running claim ended: release its slice (if the ledger still holds it) and its usage."""
        run = self._running.get(claim)
        if run is None:
            if claim in self._waiting:
                raise QueueError(f"claim {claim} is waiting, not running; use withdraw()")
            raise UnknownClaimError(f"claim {claim} is not running in this queue")
        if claim in self.ledger.allocations:
            self.ledger.release(claim)
        self._untrack(claim)

    def requeue(self, claim: str) -> None:
        """Put an admitted claim back in line at its original place (its bind failed): its slice is
        released; a claim recorded with start() has no place to go back to (QueueError)."""
        run = self._running.get(claim)
        if run is None:
            raise UnknownClaimError(f"claim {claim} is not running in this queue")
        if run.origin is None:
            raise QueueError(f"claim {claim} was recorded with start(), not admitted; it has no place in line")
        if claim in self.ledger.allocations:
            self.ledger.release(claim)
        self._untrack(claim)
        self._enqueue(run.origin, run.seq)

    def expire(self, now: float) -> list[Allocation]:
        """Cancel the ledger's lapsed reservations; the queue's own go back in line at their place.

        Returns every expired allocation. ``admit`` calls this first.
        """
        expired = self.ledger.expire(now)
        for alloc in expired:
            run = self._running.get(alloc.claim)
            if run is None:
                continue
            self._untrack(alloc.claim)
            if run.origin is not None:
                self._enqueue(run.origin, run.seq)
        return expired

    def set_priority(self, claim: str, priority: int) -> None:
        """Change a claim's priority; a waiting claim moves in line (keeping its arrival)."""
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise QueueError(f"priority must be an integer, got {priority!r}")
        if claim in self._waiting:
            waiting, key, _ = self._waiting[claim]
            self._dequeue(claim)
            self._enqueue(replace(waiting, priority=priority), key[2])
        elif claim in self._running:
            run = self._running[claim]
            if run.origin is not None:
                run.origin = replace(run.origin, priority=priority)
        else:
            raise UnknownClaimError(f"claim {claim} is neither waiting nor running")

    def set_entitlement(self, namespace: str, entitlement: Entitlement | None) -> None:
        """Set (or with None, lift) a namespace's entitlement; it applies from the next step."""
        if entitlement is not None and not isinstance(entitlement, Entitlement):
            raise QueueError(f"entitlement must be an Entitlement or None, got {type(entitlement).__name__}")
        if entitlement is None:
            self._entitlements.pop(namespace, None)
        else:
            self._entitlements[namespace] = entitlement

    # ---- queries ----------------------------------------------------------------------------------

    def waiting(self) -> int:
        """How many claims wait."""
        return len(self._waiting)

    def running(self) -> int:
        """How many claims the queue tracks as holding a slice (admitted or started)."""
        return len(self._running)

    def classes(self) -> int:
        """Distinct (request, namespace, priority) classes waiting: what a step's cost grows with."""
        return len(self._classes)

    def state(self, claim: str) -> Literal["waiting", "running"] | None:
        """Where ``claim`` is: in line, holding a slice, or unknown to the queue (None)."""
        if claim in self._waiting:
            return "waiting"
        return "running" if claim in self._running else None

    def claim(self, claim: str) -> WaitingClaim:
        """The waiting claim of that id (UnknownClaimError otherwise)."""
        try:
            return self._waiting[claim][0]
        except KeyError:
            raise UnknownClaimError(f"claim {claim} is not waiting") from None

    def usage(self, namespace: str) -> Usage:
        """What ``namespace`` holds now (admitted and started claims)."""
        return self._usage.of(namespace)

    def entitlement(self, namespace: str) -> Entitlement | None:
        """The namespace's entitlement; None when it is not capped."""
        return self._entitlements.get(namespace)

    def in_order(self) -> Iterator[WaitingClaim]:
        """Waiting claims in queue order."""
        for key in self._order:
            yield self._by_seq[key[2]][0]

    def age_limit(self, product: str) -> float:
        """T for ``product``: once a claim has waited longer, the aging guard protects it."""
        return self.age_limits.get(product, self.default_age_limit)

    def starving(self, claim: WaitingClaim, now: float) -> bool:
        """Has ``claim`` waited longer than its product's age limit?"""
        return now - claim.arrived_at > self.age_limit(claim.product)

    def estimated_start(self, request: Request, now: float, nodes: Collection[str] | None = None) -> float | None:
        """When running claims' declared ends make ``request`` fit (on one of ``nodes`` when given;
        ``packing.estimate``)."""
        return estimated_start(self.ledger, request, self._ends, now, nodes)

    # ---- the admission step ---------------------------------------------------------------------

    def admit(self, now: float) -> list[Admission]:
        """One admission step at ``now``: reserve (or commit) slices for the claims the policy lets in."""
        if not _finite(now):
            raise QueueError(f"now must be a finite number, got {now!r}")
        self.expire(now)
        out: list[Admission] = []
        dropped: set[int] = set()  # shapes that fit on no allowed node for the rest of this step
        heap = [(s.heads[0][0], s.sid, s.heads[0][1]) for s in self._shapes.values()]
        heapq.heapify(heap)
        shapes_by_id = {s.sid: s for s in self._shapes.values()}
        guard = self.admission == AGING_GUARD
        heads: list[_Head] = []  # aging guard: the starving heads met so far, each holding its drain target
        headed: set[int] = set()  # shapes that have their head
        cap = self.drain_cap()
        allowed: frozenset[str] | None = None  # nodes not held for a head (None: every node)
        while heap:
            key, sid, cid = heapq.heappop(heap)
            shape = shapes_by_id[sid]
            cls = self._classes[cid]
            waiting = self._by_seq[key[2]][0]
            name = waiting.claim
            if sid in dropped:
                # only a starving class head of a shape that does not fit is pushed after the drop
                if sid in headed or len(heads) >= cap:
                    continue  # pushed before its shape got a head, or before the cap was reached
                if self._over_entitlement(cls.namespace, shape.request):
                    self._push_starving(heap, shape, key, now)
                elif self._make_head(waiting, key, heads, now):
                    headed.add(sid)
                    allowed = self._allowed(heads)
                continue
            if not self._holds(shape.request):
                dropped.add(sid)
                continue
            if self._over_entitlement(cls.namespace, shape.request):
                self._push_next(heap, shape, key)
                continue
            choice = self.policy.choose(self.ledger, shape.request, allowed)
            if choice is None:
                dropped.add(sid)
                if self.admission == STRICT_FIFO:
                    return out
                if guard and sid not in headed and len(heads) < cap:
                    if not self.starving(waiting, now):
                        self._push_starving(heap, shape, key, now)
                    elif self._make_head(waiting, key, heads, now):
                        headed.add(sid)
                        allowed = self._allowed(heads)
                continue
            out.append(self._admit_one(name, choice, now, backfill=False))
            self._push_next(heap, shape, key)
        if guard:
            self._targets = {h.claim.claim: h.node for h in heads}
            if heads:
                self._backfill(now, heads, out, dropped, shapes_by_id)
        return out

    def drain_cap(self) -> int:
        """How many heads may hold a drain target at once: ``max_drain_targets``, and at most a
        quarter of the nodes (at least one), so most of the cluster keeps taking younger claims."""
        return min(self.max_drain_targets, max(1, len(self.ledger.nodes) // 4))

    def drain_targets(self) -> dict[str, str]:
        """The aging guard's heads after the last step: claim -> the node held for it."""
        return {c: n for c, n in self._targets.items() if c in self._waiting}

    def _allowed(self, heads: list[_Head]) -> frozenset[str]:
        held = {h.node for h in heads}
        return frozenset(n for n in self.ledger.nodes if n not in held)

    def _make_head(self, w: WaitingClaim, key: Key, heads: list[_Head], now: float) -> bool:
        """Make the starving ``w`` a head: resolve its drain target and the estimated start there."""
        node = self.drain_target(w, frozenset(h.node for h in heads), now)
        if node is None:
            return False
        heads.append(_Head(w, key, node, estimated_start(self.ledger, w.request, self._ends, now, (node,))))
        return True

    def drain_target(self, w: WaitingClaim, held: Collection[str], now: float) -> str | None:
        """The node ``admit`` holds for the starving head ``w`` while ``held`` are held for earlier heads:
        its target from earlier steps while that node is in the ledger and not in ``held``; else a
        fresh pick (``packing.drain``) among the nodes that could hold it, avoiding other heads'
        targets where it can. None when every node that could hold it is held."""
        kept = self._targets.get(w.claim)
        if kept is not None and kept not in held:
            node = self.ledger.nodes.get(kept)
            if node is not None and _could_hold(node, w.request):
                return kept
        others = {n for c, n in self._targets.items() if c != w.claim and c in self._waiting}
        able = [n.name for n in self.ledger.nodes.values() if n.name not in held and _could_hold(n, w.request)]
        free = [n for n in able if n not in others]
        return pick_target(self.ledger, w.request, self._ends, now, free or able)

    def _push_next(self, heap: list[tuple[Key, int, int]], shape: _Shape, after: Key) -> None:
        i = shape.heads.bisect_right((after, math.inf))
        if i < len(shape.heads):
            head, cid = shape.heads[i]
            heapq.heappush(heap, (head, shape.sid, cid))

    def _push_starving(self, heap: list[tuple[Key, int, int]], shape: _Shape, after: Key, now: float) -> None:
        """After ``shape`` failed to fit at ``after``: push its first later class head that is
        starving and within its entitlement (a guard candidate), if any."""
        limit = self.age_limit(product_name(shape.request))
        if not shape.by_age or now - shape.by_age[0][0] <= limit:
            return  # no class head of this shape has waited past its limit
        for head, cid in shape.heads.irange((after, math.inf), inclusive=(False, False)):
            cls = self._classes[cid]
            if now - head[1] > limit and not self._over_entitlement(cls.namespace, shape.request):
                heapq.heappush(heap, (head, shape.sid, cid))
                return

    def _backfill(
        self, now: float, heads: list[_Head], out: list[Admission], dropped: set[int], shapes: dict[int, _Shape]
    ) -> None:
        """On the drain targets: admit claims younger than a target's head whose declared time limit
        ends by that head's estimated start there; higher priority first, then the shortest declared
        limit, then arrival. Lazy: each class offers its next candidate only."""
        timed = [h for h in heads if h.est is not None]
        if self._limited_waiting == 0 or not timed:
            return
        slack = self.reservation_ttl or 0.0
        latest = max(h.est for h in timed if h.est is not None)
        bound = (latest - now - slack + 1e-6, _AFTER_KEYS)  # widened; _ends_by decides
        targets = frozenset(h.node for h in timed)
        heap: list[tuple[tuple[int, float, Key], int, int, int]] = []  # (order, sid, cid, index in cls.limits)
        for sid in dropped:
            shape = shapes[sid]
            if not shape.heads or not self._holds(shape.request):
                continue
            if self.policy.choose(self.ledger, shape.request, targets) is None:
                continue
            for _, cid in shape.heads:
                cls = self._classes[cid]
                if cls.limits and cls.limits[0] <= bound and not self._over_entitlement(cls.namespace, cls.shape):
                    heap.append((_backfill_order(cls.limits[0]), sid, cid, 0))
        heapq.heapify(heap)
        failed: dict[int, list[frozenset[str]]] = {}  # per shape: target sets it found no room on
        while heap:
            (_, _, key), sid, cid, index = heapq.heappop(heap)
            cls = self._classes[cid]
            if self._over_entitlement(cls.namespace, cls.shape):
                continue  # usage only grows within a step: the whole class stays over
            waiting = self._by_seq[key[2]][0]
            by_time = frozenset(h.node for h in timed if self._ends_by(waiting, now, h.est))
            eligible = frozenset(h.node for h in timed if h.key < key and h.node in by_time)
            if eligible:
                tried = failed.setdefault(sid, [])
                choice = None
                if not any(eligible <= f for f in tried):
                    choice = self.policy.choose(self.ledger, waiting.request, eligible)
                if choice is not None:
                    out.append(self._admit_one(waiting.claim, choice, now, backfill=True))
                    if cid in self._classes and index < len(cls.limits) and cls.limits[index] <= bound:
                        heapq.heappush(heap, (_backfill_order(cls.limits[index]), sid, cid, index))
                    continue
                tried.append(eligible)
                if eligible == by_time:
                    continue  # later claims of the class declare longer limits: no more room for them
            index += 1
            if index < len(cls.limits) and cls.limits[index] <= bound:
                heapq.heappush(heap, (_backfill_order(cls.limits[index]), sid, cid, index))

    def _ends_by(self, w: WaitingClaim, now: float, est: float | None) -> bool:
        """Does ``w``, started now, surely end by ``est`` (its declared limit, plus the reservation TTL)?"""
        if est is None or w.time_limit is None:
            return False
        return now + (self.reservation_ttl or 0.0) + w.time_limit <= est

    def _admit_one(self, name: str, choice: Choice, now: float, backfill: bool) -> Admission:
        waiting, key, _ = self._waiting[name]
        expires = now + self.reservation_ttl if self.reservation_ttl is not None else None
        alloc = self.ledger.assign(name, waiting.request, choice.node, choice.gpus, expires)
        self._dequeue(name)
        slack = self.reservation_ttl or 0.0
        ends = now + slack + waiting.time_limit if waiting.time_limit is not None else None
        self._track(name, _Running(waiting.namespace, waiting.request, now, ends, waiting, key[2]))
        return Admission(name, alloc, max(0.0, now - waiting.arrived_at), waiting.namespace, backfill)

    # ---- explain ----------------------------------------------------------------------------------

    def explain(self, now: float, limit: int | None = None) -> list[Explanation]:
        """Every waiting claim in queue order (the first ``limit`` when set), with its position, one
        reason and what it waits for.

        Reasons describe what ``admit(now)`` does with the current ledger; call it right after
        ``admit(now)`` (then no claim is ``Admissible``). O(n) plus one fit check per class and one
        capacity message per request shape (``packing.explain``): meant for periodic condition
        refreshes and the state view, not for every scheduling event.
        """
        if not _finite(now):
            raise QueueError(f"now must be a finite number, got {now!r}")
        if limit is not None and (not isinstance(limit, int) or limit < 0):
            raise QueueError(f"limit must be a whole number >= 0 or None, got {limit!r}")
        fits: dict[Request, bool] = {}
        wants: dict[Request, str] = {}

        def facts(w: WaitingClaim) -> ClassFacts:
            return self._class_facts(w, fits, wants)

        keys = self._order if limit is None else self._order.islice(0, limit)
        by_seq = self._by_seq
        entries = (by_seq[key[2]] for key in keys)
        guard = _GuardView(self, now) if self.admission == AGING_GUARD else None
        return explain_in_order(entries, now, self.admission, facts, guard, self.reservation_ttl or 0.0)

    def _class_facts(self, w: WaitingClaim, fits: dict[Request, bool], wants: dict[Request, str]) -> ClassFacts:
        """What holds for every claim of ``w``'s class now: unsatisfiable, over quota, or does it fit?
        ``fits`` and ``wants`` memoise the fit check and the capacity message per request shape."""
        r = w.request
        product = w.product
        limit = self.age_limit(product)
        if not self._holds(r):
            return ClassFacts(UNSATISFIABLE, unsatisfiable_message(r), False, product, limit)
        quota = self._shortfall(w.namespace, r)
        if quota is not None:
            return ClassFacts(QUOTA_EXCEEDED, quota, False, product, limit)
        if r not in fits:
            fits[r] = self.policy.choose(self.ledger, r) is not None
        if fits[r]:
            return ClassFacts(ADMISSIBLE, FITS_NOW, True, product, limit)
        if r not in wants:
            wants[r] = capacity_message(self.ledger, r)
        return ClassFacts(NO_CAPACITY, wants[r], False, product, limit)

    # ---- entitlements and satisfiability ------------------------------------------------------

    def _shortfall(self, namespace: str, request: Request) -> str | None:
        return shortfall(self._entitlements.get(namespace), namespace, request, self._usage)

    def _over_entitlement(self, namespace: str, request: Request) -> bool:
        return namespace in self._entitlements and self._shortfall(namespace, request) is not None

    def _holds(self, r: Request) -> bool:
        """Could some node hold ``r`` when empty? Cached per shape: a yes by the node that proved it
        (still valid while that very node is in the ledger), a no by the last node added (valid
        until another node joins; removals cannot turn a no into a yes)."""
        cached = self._holdable.get(r)
        nodes = self.ledger.nodes
        if cached is not None:
            ok, witness = cached
            if ok and witness is not None and nodes.get(witness.name) is witness:
                return True
            if not ok and next(reversed(nodes.values()), None) is witness:
                return False
        for node in nodes.values():
            if _could_hold(node, r):
                self._holdable[r] = (True, node)
                return True
        self._holdable[r] = (False, next(reversed(nodes.values()), None))
        return False

    # ---- bookkeeping -----------------------------------------------------------------------------

    def _refuse_known(self, claim: str) -> None:
        if claim in self._waiting:
            raise QueueError(f"claim {claim} is already waiting")
        if claim in self._running:
            raise QueueError(f"claim {claim} is already running")

    def _enqueue(self, claim: WaitingClaim, seq: int) -> None:
        key: Key = (-claim.priority, float(claim.arrived_at), seq)
        ckey: ClassKey = (claim.request, claim.namespace, claim.priority)
        cid = self._class_of.get(ckey)
        if cid is None:
            cid = self._new_id()
            self._class_of[ckey] = cid
            self._classes[cid] = _Class(cid, claim.request, claim.namespace, claim.priority)
        cls = self._classes[cid]
        shape = self._shapes.get(claim.request)
        if shape is None:
            shape = self._shapes[claim.request] = _Shape(self._new_id(), claim.request)
        old = cls.keys[0] if cls.keys else None
        cls.keys.add(key)
        if claim.time_limit is not None:
            cls.limits.add((claim.time_limit, key))
            self._limited_waiting += 1
        if old != cls.keys[0]:
            self._move_head(shape, cid, old, key)
        self._order.add(key)
        self._waiting[claim.claim] = self._by_seq[seq] = (claim, key, cid)

    def _dequeue(self, name: str) -> None:
        claim, key, cid = self._waiting.pop(name)
        del self._by_seq[key[2]]
        self._order.remove(key)
        cls = self._classes[cid]
        shape = self._shapes[cls.shape]
        old = cls.keys[0]
        cls.keys.remove(key)
        if claim.time_limit is not None:
            cls.limits.remove((claim.time_limit, key))
            self._limited_waiting -= 1
        if old == key:
            self._move_head(shape, cid, key, cls.keys[0] if cls.keys else None)
        if not cls.keys:
            del self._classes[cid]
            del self._class_of[(cls.shape, cls.namespace, cls.priority)]
        if not shape.heads:
            del self._shapes[cls.shape]

    @staticmethod
    def _move_head(shape: _Shape, cid: int, old: Key | None, new: Key | None) -> None:
        if old is not None:
            shape.heads.remove((old, cid))
            shape.by_age.remove((old[1], old))
        if new is not None:
            shape.heads.add((new, cid))
            shape.by_age.add((new[1], new))

    def _track(self, name: str, run: _Running) -> None:
        self._running[name] = run
        self._usage.add(run.namespace, run.request)
        if run.ends_at is not None:
            self._ends.add((run.ends_at, name))

    def _untrack(self, name: str) -> None:
        run = self._running.pop(name)
        self._usage.remove(run.namespace, run.request)
        if run.ends_at is not None:
            self._ends.remove((run.ends_at, name))

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def verify(self) -> None:
        """Recompute every index from the claims; AssertionError names the first mismatch."""
        keys = sorted(k for _, k, _ in self._waiting.values())
        assert list(self._order) == keys, "queue order index drifted"
        assert {e[1][2]: e for e in self._waiting.values()} == self._by_seq, "seq index drifted"
        members: dict[int, list[Key]] = {}
        limited = 0
        for claim, key, cid in self._waiting.values():
            cls = self._classes[cid]
            assert (cls.shape, cls.namespace, cls.priority) == (claim.request, claim.namespace, claim.priority)
            assert key == (-claim.priority, float(claim.arrived_at), key[2]), f"{claim.claim}: stale key"
            members.setdefault(cid, []).append(key)
            limited += claim.time_limit is not None
        assert limited == self._limited_waiting, "limited-claim count drifted"
        assert set(members) == set(self._classes), "empty or missing class"
        heads: dict[Request, list[tuple[Key, int]]] = {}
        for cid, cls in self._classes.items():
            assert list(cls.keys) == sorted(members[cid]), f"class {cid} drifted"
            lims = sorted((self._by_seq[k[2]][0].time_limit, k) for k in members[cid]
                          if self._by_seq[k[2]][0].time_limit is not None)
            assert list(cls.limits) == lims, f"class {cid} time-limit index drifted"
            heads.setdefault(cls.shape, []).append((cls.keys[0], cid))
        assert set(heads) == set(self._shapes), "empty or missing shape"
        for request, shape in self._shapes.items():
            assert list(shape.heads) == sorted(heads[request]), "shape head index drifted"
            assert list(shape.by_age) == sorted((k[1], k) for k, _ in heads[request]), "shape age index drifted"
        book = UsageBook()
        for run in self._running.values():
            book.add(run.namespace, run.request)
        for ns in set(book.namespaces()) | set(self._usage.namespaces()):
            assert book.of(ns) == self._usage.of(ns), f"usage of {ns} drifted"
        ends = sorted((r.ends_at, n) for n, r in self._running.items() if r.ends_at is not None)
        assert list(self._ends) == ends, "declared-end index drifted"
        assert not set(self._waiting) & set(self._running), "a claim both waits and runs"


class _GuardView:
    """What explain asks about the aging guard's drain targets, memoised for one pass (``packing.explain.Guard``)."""

    def __init__(self, queue: ClaimQueue, now: float) -> None:
        self.queue = queue
        self.now = now
        self.cap = queue.drain_cap()
        self._outside: dict[tuple[Request, frozenset[str]], bool] = {}
        self._on: dict[tuple[Request, str], bool] = {}

    def fits_outside(self, request: Request, held: frozenset[str]) -> bool:
        """Does ``request`` fit now on a node not in ``held``?"""
        key = (request, held)
        if key not in self._outside:
            q = self.queue
            rest = frozenset(n for n in q.ledger.nodes if n not in held)
            self._outside[key] = q.policy.choose(q.ledger, request, rest) is not None
        return self._outside[key]

    def fits_on(self, request: Request, node: str) -> bool:
        """Does ``request`` fit now on ``node``?"""
        key = (request, node)
        if key not in self._on:
            q = self.queue
            self._on[key] = q.policy.choose(q.ledger, request, (node,)) is not None
        return self._on[key]

    def target(self, head: WaitingClaim, held: frozenset[str]) -> tuple[str, float | None] | None:
        """The drain target ``admit`` would hold for ``head`` and its estimated start there."""
        q = self.queue
        node = q.drain_target(head, held, self.now)
        if node is None:
            return None
        return node, estimated_start(q.ledger, head.request, q._ends, self.now, (node,))


def _backfill_order(entry: tuple[float, Key]) -> tuple[int, float, Key]:
    """Backfill order of a (time limit, Key) entry: priority, then the shortest limit, then arrival."""
    limit, key = entry
    return (key[0], limit, key)


def _could_hold(node: Node, r: Request) -> bool:
    """Could ``node``, empty, hold ``r``?"""
    if node.cpu_milli is not None and r.cpu_milli > node.cpu_milli:
        return False
    if node.memory_mib is not None and r.host_memory_mib > node.memory_mib:
        return False
    if r.gpu_less:
        return True
    cards = sum(1 for g in node.gpus if r.accepts_model(g.model) and g.milli >= r.milli
                and g.memory_mib >= r.memory_mib)
    return cards >= r.count
