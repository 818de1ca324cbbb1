"""``aging-guard``: best effort, except that a starving claim holds one node -- its drain target -- for itself.

Rule. In queue order, a claim that does not fit on any node outside the targets held so far, has
waited longer than its product's age limit T, is within its entitlement and is the first such claim
of its request shape becomes a **head** and holds one node (``packing.drain``): kept across steps
while it starves, re-picked only when that node leaves the ledger or an older head holds it. At most
``drain_cap`` = min(max_drain_targets, max(1, nodes // 4)) heads hold a node, the oldest first.
Younger claims are placed anywhere but the targets of the heads ahead of them; on a target only a
claim whose declared limit ends by that head's estimated start there (backfill: priority, then the
shortest limit, then arrival).

Guarantee. Once a claim is a head, nothing younger is placed on its target unless it provably ends
before the head's estimated start there, so the head starts at the latest when its target drains:
its wait is at most T + the longest remaining runtime on the target (T + L if every running claim
declares a limit of at most L). Higher priority always goes first; the bound holds within a
priority level. The price: a target is a whole node, even for a head that needs a quarter of a card.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection
from dataclasses import dataclass

from packing.admission.view import AdmissionView
from packing.claims import AGING_GUARD, DEFAULT_AGE_LIMIT, DEFAULT_DRAIN_TARGETS, Admission, WaitingClaim
from packing.drain import could_hold, pick_target
from packing.entitlements import product_name
from packing.estimate import estimated_start
from packing.explain import (
    BLOCKED_BY_HEAD_OF_LINE,
    WAITING_FOR_RESERVATION,
    Lens,
    guard_message,
    starving_message,
)
from packing.ledger import Ledger
from packing.products import Request
from packing.waiting_order import AFTER_KEYS, Key, Shape, Walk


@dataclass(frozen=True, slots=True)
class _Head:
    """A starving head of the line in one step: the node held for it, and its estimated start there."""

    claim: WaitingClaim
    key: Key
    node: str
    est: float | None


class AgingGuard:
    """The strategy object: it keeps each head's drain target between steps."""

    name = AGING_GUARD

    def __init__(self, max_drain_targets: int = DEFAULT_DRAIN_TARGETS) -> None:
        self.max_drain_targets = max_drain_targets
        self._targets: dict[str, str] = {}  # starving head -> its drain target, kept across steps

    def drain_cap(self, ledger: Ledger) -> int:
        """How many heads may hold a drain target at once: ``max_drain_targets``, and at most a
        quarter of the nodes (at least one), so most of the cluster keeps taking younger claims."""
        return min(self.max_drain_targets, max(1, len(ledger.nodes) // 4))

    def targets(self) -> dict[str, str]:
        return dict(self._targets)

    def default_age_limit(self, request: Request) -> float:
        return DEFAULT_AGE_LIMIT

    def group_age_limit(self, request: Request) -> float:
        return self.default_age_limit(request)

    def step(self, view: AdmissionView) -> list[Admission]:
        out: list[Admission] = []
        while self._pass(view, out):
            pass  # a head started by backfill: its node is free again and its shape takes its next head
        return out

    def _pass(self, view: AdmissionView, out: list[Admission]) -> bool:
        """One walk of the queue and its backfill, admissions appended to ``out``; True when the
        backfill started a head (then the step walks again, so that what explain says holds)."""
        first = len(out)
        dropped: set[int] = set()  # shapes that fit on no allowed node for the rest of this step
        walk = view.walk()
        shapes: dict[int, Shape] = {}
        heads: list[_Head] = []  # the starving heads met so far, each holding its drain target
        headed: set[int] = set()  # shapes that have their head
        cap = self.drain_cap(view.ledger)
        allowed: frozenset[str] | None = None  # nodes not held for a head (None: every node)
        while (item := walk.pop()) is not None:
            key, shape, cls = item
            shapes[shape.sid] = shape
            sid = shape.sid
            waiting = view.claim_at(key)
            if sid in dropped:
                # only a starving class head of a shape that does not fit is offered after the drop
                if sid in headed or len(heads) >= cap:
                    continue  # offered before its shape got a head, or before the cap was reached
                if view.over_entitlement(cls):
                    self._offer_starving(view, walk, shape, key)
                elif self._make_head(view, waiting, key, heads):
                    headed.add(sid)
                    allowed = _allowed(view.ledger, heads)
                continue
            if not view.satisfiable(shape.request):
                dropped.add(sid)
                continue
            if view.over_entitlement(cls):
                walk.advance(shape, key)
                continue
            choice = view.choose(shape.request, allowed)
            if choice is None:
                dropped.add(sid)
                if sid not in headed and len(heads) < cap:
                    if not view.starving(waiting):
                        self._offer_starving(view, walk, shape, key)
                    elif self._make_head(view, waiting, key, heads):
                        headed.add(sid)
                        allowed = _allowed(view.ledger, heads)
                continue
            out.append(view.admit(waiting.claim, choice))
            walk.advance(shape, key)
        if heads:
            self._backfill(view, heads, out, dropped, shapes)
        started = {a.claim for a in out[first:]}
        self._targets = {h.claim.claim: h.node for h in heads if h.claim.claim not in started}
        return any(h.claim.claim in started for h in heads)

    def _make_head(self, view: AdmissionView, w: WaitingClaim, key: Key, heads: list[_Head]) -> bool:
        """Make the starving ``w`` a head: resolve its drain target and the estimated start there."""
        node = self.drain_target(view, w, frozenset(h.node for h in heads))
        if node is None:
            return False
        est = estimated_start(view.ledger, w.request, view.book.ends, view.now, (node,))
        heads.append(_Head(w, key, node, est))
        return True

    def drain_target(self, view: AdmissionView, w: WaitingClaim, held: Collection[str]) -> str | None:
        """The node held for the starving head ``w`` while ``held`` are held for earlier heads: its
        target from earlier steps while that node is in the ledger and not in ``held``; else a fresh
        pick (``packing.drain``) among the nodes that could hold it, avoiding other heads' targets
        where it can. None when every node that could hold it is held."""
        ledger = view.ledger
        kept = self._targets.get(w.claim)
        if kept is not None and kept not in held:
            node = ledger.nodes.get(kept)
            if node is not None and could_hold(node, w.request):
                return kept
        others = {n for c, n in self._targets.items() if c != w.claim and c in view.order}
        able = [n.name for n in ledger.nodes.values() if n.name not in held and could_hold(n, w.request)]
        free = [n for n in able if n not in others]
        return pick_target(ledger, w.request, view.book.ends, view.now, free or able)

    @staticmethod
    def _offer_starving(view: AdmissionView, walk: Walk, shape: Shape, after: Key) -> None:
        """After ``shape`` failed to fit at ``after``: offer its first later class head that is
        starving and within its entitlement (a guard candidate), if any."""
        limit = view.age_limit(product_name(shape.request), shape.request)
        if not shape.by_age or view.now - shape.by_age[0][0] <= limit:
            return  # no class head of this shape has waited past its limit
        for head, cid in shape.heads.irange((after, AFTER_KEYS[0]), inclusive=(False, False)):
            cls = view.order.classes[cid]
            if view.now - head[1] > limit and not view.over_entitlement(cls):
                walk.offer(head, shape, cid)
                return

    @staticmethod
    def _backfill(view: AdmissionView, heads: list[_Head], out: list[Admission], dropped: set[int],
                  shapes: dict[int, Shape]) -> None:
        """On the drain targets: admit claims younger than a target's head whose declared time limit
        ends by that head's estimated start there; higher priority first, then the shortest declared
        limit, then arrival. Lazy: each class offers its next candidate only."""
        timed = [h for h in heads if h.est is not None]
        if view.order.limited == 0 or not timed:
            return
        latest = max(h.est for h in timed if h.est is not None)
        bound = (latest - view.now - view.slack + 1e-6, AFTER_KEYS)  # widened; ends_by decides
        targets = frozenset(h.node for h in timed)
        classes = view.order.classes
        heap: list[tuple[tuple[int, float, Key], int, int, int]] = []  # (order, sid, cid, index in cls.limits)
        for sid in dropped:
            shape = shapes[sid]
            if not shape.heads or not view.satisfiable(shape.request):
                continue
            if view.choose(shape.request, targets) is None:
                continue
            for _, cid in shape.heads:
                head = classes[cid]
                if head.limits and head.limits[0] <= bound and not view.over_entitlement(head):
                    heap.append((_backfill_order(head.limits[0]), sid, cid, 0))
        heapq.heapify(heap)
        failed: dict[int, list[frozenset[str]]] = {}  # per shape: target sets it found no room on
        while heap:
            (_, _, key), sid, cid, index = heapq.heappop(heap)
            found = classes.get(cid)
            if found is None or view.over_entitlement(found):
                continue  # usage only grows within a step: the whole class stays over
            cls = found
            waiting = view.claim_at(key)
            by_time = frozenset(h.node for h in timed if view.ends_by(waiting, h.est))
            eligible = frozenset(h.node for h in timed if h.key < key and h.node in by_time)
            if eligible:
                tried = failed.setdefault(sid, [])
                choice = None
                if not any(eligible <= f for f in tried):
                    choice = view.choose(waiting.request, eligible)
                if choice is not None:
                    out.append(view.admit(waiting.claim, choice, backfill=True))
                    if cid in classes and index < len(cls.limits) and cls.limits[index] <= bound:
                        heapq.heappush(heap, (_backfill_order(cls.limits[index]), sid, cid, index))
                    continue
                tried.append(eligible)
                if eligible == by_time:
                    continue  # later claims of the class declare longer limits: no more room for them
            index += 1
            if index < len(cls.limits) and cls.limits[index] <= bound:
                heapq.heappush(heap, (_backfill_order(cls.limits[index]), sid, cid, index))

    def lens(self, view: AdmissionView) -> Lens | None:
        return _GuardLens(self, view)


def _allowed(ledger: Ledger, heads: list[_Head]) -> frozenset[str]:
    held = {h.node for h in heads}
    return frozenset(n for n in ledger.nodes if n not in held)


def _backfill_order(entry: tuple[float, Key]) -> tuple[int, float, Key]:
    """Backfill order of a (time limit, Key) entry: priority, then the shortest limit, then arrival."""
    limit, key = entry
    return (key[0], limit, key)


@dataclass(frozen=True, slots=True)
class _Held:
    node: str
    head: WaitingClaim
    est: float | None
    blocked: str  # what a younger claim that fits only on this node is told


class _GuardLens:
    """Explain under the aging guard: follows the heads and their targets in queue order, as the step
    does, memoising the fit checks of one pass."""

    def __init__(self, guard: AgingGuard, view: AdmissionView) -> None:
        self.guard = guard
        self.view = view
        self.cap = guard.drain_cap(view.ledger)
        self.held: list[_Held] = []
        self.held_nodes: frozenset[str] = frozenset()
        self.headed: set[Request] = set()
        self._outside: dict[tuple[Request, frozenset[str]], bool] = {}
        self._on: dict[tuple[Request, str], bool] = {}

    def see(self, w: WaitingClaim, fit: bool, message: str) -> tuple[str, str, float | None] | None:
        view = self.view
        if fit and (not self.held or self._fits_outside(w.request)):
            return None
        limit = view.limit_of(w)
        if w.request not in self.headed and len(self.held) < self.cap and view.now - w.arrived_at > limit:
            node = self.guard.drain_target(view, w, self.held_nodes)
            if node is not None:
                est = estimated_start(view.ledger, w.request, view.book.ends, view.now, (node,))
                self.headed.add(w.request)
                self.held.append(_Held(node, w, est, guard_message(w, node, view.now, est, limit)))
                self.held_nodes = self.held_nodes | {node}
                need = message if not fit else "fits only on nodes held for older claims"
                return WAITING_FOR_RESERVATION, f"{need}; {starving_message(w, node, view.now, est, limit)}", est
        if fit:
            on = [h for h in self.held if self._fits_on(w.request, h.node)]
            if not any(view.ends_by(w, h.est) for h in on):
                return BLOCKED_BY_HEAD_OF_LINE, on[0].blocked, None
        return None

    def _fits_outside(self, request: Request) -> bool:
        key = (request, self.held_nodes)
        if key not in self._outside:
            rest = frozenset(n for n in self.view.ledger.nodes if n not in self.held_nodes)
            self._outside[key] = self.view.choose(request, rest) is not None
        return self._outside[key]

    def _fits_on(self, request: Request, node: str) -> bool:
        key = (request, node)
        if key not in self._on:
            self._on[key] = self.view.choose(request, (node,)) is not None
        return self._on[key]
