"""``drain-soonest``: claims past their product's aging clock go first, and each that does not fit
holds the GPUs that should free up for it soonest.

Rule, per step (``packing/QUEUE.md`` has the details):

1. **Starving first.** A claim *starves* once it has waited longer than its product's age limit T
   (the per-product aging clock; without one, by size: one whole card and slices of at most 250
   milli at once, larger slices and several cards after 4 h). Starving claims go first: by priority, then by the
   time they started to starve (arrival + T), then arrival order.
2. **Heads.** A starving claim (within its entitlement, satisfiable, needing a GPU) that fits on no
   GPU outside the drain targets is a *head* while its target keeps the GPUs held within ``cap``
   (the first head of a step always is one). The heads of one request
   shape share a pool of drain targets, one per head: ``count`` GPUs of one node each, picked
   (``packing.drain.pick_gpu_target``) as the likeliest to take the head within the horizon -- by
   declared ends where the claims there declare limits, else by ``RuntimeHistory``. From the
   shape's first head on, its pool's free capacity is held for the step (``packing.admission.holds``);
   when a target can take the shape, the oldest head of the shape starts there. Pools shrink to one
   target per head, always keeping the earliest-picked one.
3. **Everyone else** is placed as best effort does, in queue order, anywhere but on held GPUs.
4. **Backfill.** On a target whose declared ends free it by D, a waiting single-GPU claim may start
   if its own declared limit (plus the reservation TTL) ends by D: priority, then the shortest
   limit, then arrival.

Guarantee (proved in ``packing/QUEUE.md``, *The drain-soonest bound*; checked against the
simulation engine by ``tests/property/test_queue_bounded_wait.py``). In one priority level, on a
fixed cluster without entitlements or reservations, with a step at every arrival and departure: if
every claim declares an enforced limit of at most L, a satisfiable claim c needing a GPU that
starts to starve at s_c starts by ``s_c + (A_c + 1) * L``, A_c being the claims ahead of it in
starving order still waiting at s_c. Without declared limits the same holds with L the longest
runtime: no claim starves for ever. Claims that fit off the held GPUs never wait for a head.

Cost: a step costs what best effort costs, plus one pass over the starving class heads, plus per
new head one scan of the GPUs (O(GPUs + running claims)); backfill looks at classes declaring
limits only when a target has a declared drain.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Protocol

from packing.admission.holds import Holds, fits_off, is_hold
from packing.admission.view import AdmissionView
from packing.claims import DRAIN_SOONEST, Admission, WaitingClaim
from packing.drain import GpuTarget, claims_by_gpu, gpu_target, pick_gpu_target
from packing.explain import (
    BLOCKED_BY_HEAD_OF_LINE,
    NO_CAPACITY,
    WAITING_FOR_RESERVATION,
    Lens,
    drain_blocked_message,
    drain_message,
    front_pending_message,
)
from packing.ledger import Allocation, Ledger
from packing.products import Request
from packing.waiting_order import ClaimClass, Key

DEFAULT_HORIZON = 1800.0  # seconds: "likeliest to hold the head within half an hour"
# The default aging clocks, by size (``age_limits`` per product override them): a whole card needs a
# drained card, which a stream of slices never leaves by chance, so it starts draining at once; so
# does a small slice, whose drain is short (one claim leaving frees it); larger slices and requests
# of several cards (whose heads would hold several GPUs of a node) only after 4 h, the price of the
# two (protocol B: at 60 min, or for multi-card requests at once, the others waited much longer).
WHOLE_AGE_LIMIT = 0.0
SMALL_SLICE_MILLI = 250
SMALL_SLICE_AGE_LIMIT = 0.0
SLICE_AGE_LIMIT = 4 * 3600.0  # larger slices and multi-card requests
HEAD_SHARE = 2  # by default targets take at most one GPU in this many (protocol B: 16 of 64 too few)
MAX_HEADS = 64  # and at most this many GPUs: a new head's pick scans the GPUs
FRONT_CHANCE = 0.5  # a front with a horizon (``Holding.front_horizon``) holds once a target likely frees within it

StarveKey = tuple[int, float, int]  # (-priority, arrived_at + T, seq)


class Holding(Protocol):
    """Who may hold capacity, and how firmly: drain-soonest's rule (``STRICT``) or another strategy's
    (``packing.admission.worst_first``) run on this module's pools, targets and holds."""

    strict: bool  # every head's targets are held; False: only the front's shape's, the others steer (below)

    def may_head(self, view: AdmissionView, claim: WaitingClaim) -> bool:
        """May this starving claim, which fits nowhere off the targets, hold a target now?"""

    def front_cap(self, view: AdmissionView, r: Request, declared: bool) -> int | None:
        """Where targets steer: the most GPUs the front's shape ``r`` holds (its first head's always); None: no cap.
        ``declared``: declared ends alone free a target of the front's (``DrainSoonest.front_declared``)."""

    def front_horizon(self, view: AdmissionView, claim: WaitingClaim) -> float | None:
        """Where targets steer: the front's targets are held only once one likely (``FRONT_CHANCE``) frees
        within this many seconds (at least the strategy's horizon); None: held at once."""

    def front_sure(self, view: AdmissionView, claim: WaitingClaim) -> float | None:
        """With a horizon: the front's targets are also held once the declared ends alone free one within
        this many seconds (the bounds count on it)."""


GpuAsk = tuple[str | None, int, int, int, str | None]  # product, milli, MiB, count, model


def gpu_ask(r: Request) -> GpuAsk:
    """The GPUs a request asks for, its host CPU, memory and node constraints aside: where targets steer, the
    front's hold covers every head asking the same (pods of one product differ in those, and each
    such difference is a request shape of its own: the front's share and spare caps would miss them)."""
    return (r.product, r.milli, r.memory_mib, r.count, r.model)


def asks_same(r: Request, front: Request | None) -> bool:
    """Does ``r`` ask for the GPUs ``front`` asks (``gpu_ask``)? False without a front."""
    return front is not None and gpu_ask(r) == gpu_ask(front)


def past_front_share(heads: int, r: Request, cap: int | None) -> bool:
    """Would one more head of the front's shape ``r`` (``heads`` so far) take its held targets past ``cap`` GPUs
    (``Holding.front_cap``; None: no cap)? The front's own always holds: the caller never asks for it."""
    return cap is not None and (heads + 1) * r.count > max(1, cap)


class _Strict:
    """drain-soonest's own rule: every starving claim may be a head, and every target is held."""

    strict = True

    def may_head(self, view: AdmissionView, claim: WaitingClaim) -> bool:
        return True

    def front_cap(self, view: AdmissionView, r: Request, declared: bool) -> int | None:
        return None  # every head's targets are held: no front

    def front_horizon(self, view: AdmissionView, claim: WaitingClaim) -> float | None:
        return None

    def front_sure(self, view: AdmissionView, claim: WaitingClaim) -> float | None:
        return None


STRICT: Holding = _Strict()


@dataclass(frozen=True, slots=True)
class _Pooled:
    """A drain target in its shape's pool, and when it was picked (the bound counts from then)."""

    target: GpuTarget
    picked_at: float


@dataclass(frozen=True, slots=True)
class _Head:
    claim: WaitingClaim
    target: GpuTarget


class DrainSoonest:
    """The strategy object: it keeps each request shape's pool of drain targets between steps."""

    name = DRAIN_SOONEST

    def __init__(self, max_heads: int | None = None, horizon: float = DEFAULT_HORIZON, holding: Holding = STRICT,
                 share: int = HEAD_SHARE, words: HeadWords | None = None) -> None:
        self.max_heads = max_heads
        self.horizon = horizon
        self.holding = holding
        self.share = share
        self.words = words or _DRAIN_WORDS
        self._pools: dict[Request, list[_Pooled]] = {}  # per shape: one target per head, kept across steps
        self._heads: dict[str, _Head] = {}  # after the last step: head -> the target shown as its own
        self._front: Request | None = None  # after the last step: the shape of its first head (held strictly)
        self._front_pending: float | None = None  # after the last step: the front's horizon while it steers
        self._front_declared = False  # after the last step: declared ends alone free a target of the front's

    def cap(self, ledger: Ledger) -> int:
        """How many GPUs the heads' targets may take at once (the first head's always): ``max_heads``,
        by default one GPU in ``share`` (HEAD_SHARE), at most MAX_HEADS."""
        if self.max_heads is not None:
            return self.max_heads
        return max(1, min(MAX_HEADS, len(ledger.gpus) // self.share))

    def front(self) -> str | None:
        """After the last step: the first head of the step (the oldest of its shape); where targets steer,
        those of its shape are the ones held. None without heads."""
        if self._front is None:
            return None
        return next((c for c, h in self._heads.items() if asks_same(h.claim.request, self._front)), None)

    def front_full(self, view: AdmissionView) -> Request | None:
        """After the last step, while its front waits: the front's shape when the targets of its waiting heads
        hold their share (``Holding.front_cap``), so that no further claim of it gets one; else None."""
        r, front = self._front, self.front()
        if r is None or front is None or front not in view.order:
            return None
        heads = sum(1 for c, h in self._heads.items() if asks_same(h.claim.request, r) and c in view.order)
        return r if past_front_share(heads, r, self.holding.front_cap(view, r, self._front_declared)) else None

    def front_declared(self) -> bool:
        """After the last step: whether the declared ends of the claims on a target of the front's alone free it
        (its ``drains_by`` is known); False without a front, or for a front of several cards."""
        return self._front_declared

    def front_pending(self) -> float | None:
        """After the last step: the front's horizon while its targets steer (``Holding.front_horizon``), else None."""
        return self._front_pending

    def targets(self) -> dict[str, str]:
        return {c: h.target.node for c, h in self._heads.items()}

    def default_age_limit(self, request: Request) -> float:
        if request.gpu_less or (request.whole and request.count == 1):
            return WHOLE_AGE_LIMIT
        if request.whole:
            return SLICE_AGE_LIMIT
        return SMALL_SLICE_AGE_LIMIT if request.milli <= SMALL_SLICE_MILLI else SLICE_AGE_LIMIT

    def group_age_limit(self, request: Request) -> float:
        return self.default_age_limit(request)  # a group holds several GPUs, as a multi-card head does

    def gpu_targets(self) -> dict[str, GpuTarget]:
        """After the last step: each head -> the GPUs held for it (its shape's targets, the likeliest
        to free first shown for the oldest head) and how soon they should free."""
        return {c: h.target for c, h in self._heads.items()}

    # ---- the step -----------------------------------------------------------------------------------

    def step(self, view: AdmissionView) -> list[Admission]:
        holds = Holds(view.ledger)
        try:
            return _Step(self, view, holds).run()
        finally:
            holds.release_all()

    def lens(self, view: AdmissionView) -> Lens | None:
        return _DrainLens(self, view, self.words)


class _Step:
    """One step of drain-soonest: what it has decided so far."""

    def __init__(self, strategy: DrainSoonest, view: AdmissionView, holds: Holds) -> None:
        self.s = strategy
        self.view = view
        self.ledger = view.ledger
        self.holds = holds
        self.out: list[Admission] = []
        self.failed: dict[Request, int] = {}  # shapes that fit nowhere off the holds -> ``holds.lifted`` then
        self.heads: dict[Request, list[WaitingClaim]] = {}  # this step's heads by shape, in starving order
        self.held_gpus = 0  # GPUs the targets of this step's heads take
        self._on: dict[str, list[Allocation]] | None = None
        self._on_at = -1
        self.pools = self._carry_over()  # last step's targets still in the ledger, by shape
        self.guarded: set[Request] = set()  # shapes whose pool is held: from their first head on
        self.front: Request | None = None  # the shape of the step's first head: its pool is held (see _front_horizon)
        self._sat: dict[Request, bool] = {}
        self.strict = strategy.holding.strict
        self._pending: tuple[tuple[int, int, int], float | None] | None = None  # memo of _front_horizon
        self._declared: tuple[tuple[int, int, int], bool] | None = None  # memo of _front_declared

    def run(self) -> list[Admission]:
        self._starving_pass()
        self._trim()
        self._best_effort_pass()
        self._backfill()
        lifted = self.holds.lifted
        self._drop_over_entitlement()
        if self.holds.lifted != lifted:  # targets let go: what fits there now starts this step, not the next
            self._best_effort_pass()
        self.s._pools = self.pools
        self.s._heads = self._shown()
        self.s._front = self.front if self.front is not None and self.heads.get(self.front) else None
        self.s._front_pending = self._front_horizon() if self.s._front is not None else None
        self.s._front_declared = self.s._front is not None and self._front_declared(self.s._front)
        return self.out

    # ---- the pools ---------------------------------------------------------------------------------

    def _claims_on(self) -> dict[str, list[Allocation]]:
        """Claims by GPU (holds left out), rebuilt once something was admitted since."""
        if self._on is None or self._on_at != len(self.out):
            skip = {a for a in self.ledger.allocations if is_hold(a)}
            self._on = claims_by_gpu(self.ledger, skip)
            self._on_at = len(self.out)
        return self._on

    def _carry_over(self) -> dict[Request, list[_Pooled]]:
        ledger = self.ledger
        pools: dict[Request, list[_Pooled]] = {}
        for shape, pool in self.s._pools.items():
            alive = [p for p in pool if p.target.node in ledger.nodes and ledger.nodes[p.target.node].allows(shape)
                     and all(u in ledger.gpus and ledger.gpus[u].node == p.target.node for u in p.target.gpus)]
            if alive:
                pools[shape] = alive
        return pools

    def _rescored(self, shape: Request, t: GpuTarget, horizon: float | None = None) -> GpuTarget:
        """``t`` scored for ``shape`` now, within ``horizon`` (the strategy's by default)."""
        v = self.view
        return gpu_target(self.ledger, shape, t.node, t.gpus, self._claims_on(), v.book.runs, v.book.history, v.now,
                          self.s.horizon if horizon is None else horizon)

    def _trim(self) -> None:
        """Keep one target per head of each shape: the oldest-picked always (the bound counts on it),
        then the likeliest to free soonest; release the rest."""
        nodes = self.ledger.nodes
        for shape in list(self.pools):
            want = len(self.heads.get(shape, ()))
            pool = self.pools[shape]
            if want == 0:
                for p in self.pools.pop(shape):
                    for u in p.target.gpus:
                        self.holds.lift(u)
                continue
            if len(pool) <= want:
                continue
            scored = [_Pooled(self._rescored(shape, p.target), p.picked_at) for p in pool]
            oldest = min(scored, key=lambda p: p.picked_at)
            rest = sorted((p for p in scored if p is not oldest),
                          key=lambda p: p.target.order(nodes[p.target.node].order))
            self.pools[shape] = [oldest, *rest[:want - 1]]
            kept = {u for p in self.pools[shape] for u in p.target.gpus}
            for p in pool:
                for u in p.target.gpus:
                    if u not in kept:
                        self.holds.lift(u)

    def _drop_over_entitlement(self) -> None:
        """A head whose namespace the step's admissions took to its entitlement is a head no more."""
        book = self.view.book
        for heads in self.heads.values():
            heads[:] = [w for w in heads if not book.over_entitlement(w.namespace, w.request)]
        self._trim()

    def _shown(self) -> dict[str, _Head]:
        """Which target explain shows for which head: the likeliest to free first for the oldest head."""
        nodes = self.ledger.nodes
        shown: dict[str, _Head] = {}
        for shape, heads in self.heads.items():
            pool = sorted(self.pools.get(shape, ()), key=lambda p: p.target.order(nodes[p.target.node].order))
            for w, p in zip(heads, pool, strict=False):
                shown[w.claim] = _Head(w, p.target)
        return shown

    # ---- 1 and 2: starving claims, heads ---------------------------------------------------------------

    def _starving_pass(self) -> None:
        v = self.view
        classes = v.order.classes
        heap: list[tuple[StarveKey, int, int]] = []
        for cls in classes.values():
            self._offer(heap, cls, 0)
        heapq.heapify(heap)
        cap = self.s.cap(self.ledger)
        while heap:
            _, cid, i = heapq.heappop(heap)
            found = classes.get(cid)
            if found is None or i >= len(found.keys):
                continue
            cls = found
            r = cls.shape
            if not self._satisfiable(r) or v.over_entitlement(cls):
                continue  # the whole class: it never fits, or usage only grows within a step
            w = v.claim_at(cls.keys[i])
            if not self._failed(r):
                choice = v.choose(r)
                if choice is not None:
                    self.out.append(v.admit(w.claim, choice))
                    self._offer(heap, cls, i, push=True)
                    continue
                if self._steered(w):
                    self._offer(heap, cls, i, push=True)
                    continue
                self.failed[r] = self.holds.lifted
            if r.gpu_less or (self.held_gpus > 0 and self.held_gpus + r.count > cap):
                continue  # the first head always holds its target; the others only within the cap
            if not self.s.holding.may_head(v, w):
                continue  # not yet (its shape's later claims waited less)
            if self._of_front(r) and past_front_share(self._front_heads(), r,
                                                      self.s.holding.front_cap(v, r, self._front_declared(r))):
                continue  # the front's ask already holds its share; the front itself always holds
            if r not in self.guarded:  # from its shape's first head on, its pool takes nothing new
                self.guarded.add(r)
                for p in self.pools.get(r, ()):
                    for u in p.target.gpus:
                        self.holds.hold(u)
            if self._start_on_ready_target(w):
                self._offer(heap, cls, i, push=True)
                continue
            heads = self.heads.setdefault(r, [])
            if len(self.pools.get(r, ())) <= len(heads) and not self._pick_for(r):
                continue  # every GPU that could hold it is held for a head ahead of it
            heads.append(w)
            if self.front is None:
                self.front = r
            self.held_gpus += r.count
            self._offer(heap, cls, i + 1, push=True)

    def _of_front(self, r: Request) -> bool:
        """Does ``r`` ask for the GPUs the step's front asks (``gpu_ask``)? Its targets are held with the front's."""
        return asks_same(r, self.front)

    def _front_heads(self) -> int:
        """This step's heads asking for what the front asks."""
        return sum(len(heads) for shape, heads in self.heads.items() if self._of_front(shape))

    def _front_declared(self, r: Request) -> bool:
        """For a front of one GPU (``r``, its shape): do the declared ends alone free a target of the front's
        (rescored now: ``drains_by`` known)? False for several cards, which no holding asks. Memoised per step
        until an admission or a lift changes the GPUs."""
        if r.count > 1:
            return False
        key = (len(self.out), self.holds.lifted, len(self._front_pools()))
        if self._declared is not None and self._declared[0] == key:
            return self._declared[1]
        declared = any(self._rescored(shape, p.target).drains_by is not None for shape, p in self._front_pools())
        self._declared = (key, declared)
        return declared

    def _front_pools(self) -> list[tuple[Request, _Pooled]]:
        """The targets of the heads asking for what the front asks, each with its shape."""
        return [(shape, p) for shape, pool in self.pools.items() if self._of_front(shape) for p in pool]

    def _failed(self, r: Request) -> bool:
        """Did ``r`` fit nowhere off the holds, and has no hold been lifted since? (A lifted hold -- a target
        trimmed, or a head started on part of it -- may make room: then ``r`` is tried again.)"""
        return self.failed.get(r) == self.holds.lifted

    def _satisfiable(self, r: Request) -> bool:
        """``view.satisfiable``, once per shape and step (every class of a shape asks)."""
        known = self._sat.get(r)
        if known is None:
            known = self._sat[r] = self.view.satisfiable(r)
        return known

    def _offer(self, heap: list[tuple[StarveKey, int, int]], cls: ClaimClass, i: int, push: bool = False) -> None:
        """Offer the ``i``-th claim of ``cls`` if it starves (the later ones starve later)."""
        if i >= len(cls.keys):
            return
        key: Key = cls.keys[i]
        limit = self.view.limit_of(self.view.claim_at(key))
        if self.view.now - key[1] <= limit:
            return
        item = ((key[0], key[1] + limit, key[2]), cls.cid, i)
        if push:
            heapq.heappush(heap, item)
        else:
            heap.append(item)

    def _start_on_ready_target(self, w: WaitingClaim) -> bool:
        """Start head ``w`` on a target of its shape's pool that holds it now, if any: the oldest head
        of a shape takes the first of its targets to free."""
        r = w.request
        pool = self.pools.get(r, [])
        for p in pool:
            t = p.target
            if not self._holds_now(r, t):
                continue
            for u in t.gpus:
                self.holds.lift(u)
            self.out.append(self.view.admit_on(w.claim, t.node, t.gpus))
            pool.remove(p)
            return True
        return False

    def _holds_now(self, r: Request, t: GpuTarget) -> bool:
        """Would ``t``, without its holds, take ``r`` now?"""
        node = self.ledger.nodes[t.node]
        if not self.ledger.host_fits(node, r) or not node.allows(r):
            return False
        for u in t.gpus:
            g = self.ledger.gpus[u]
            milli, mib = self.holds.free(g)
            if r.whole and (milli != g.milli or mib != g.memory_mib):
                return False
            if milli < r.milli or mib < r.memory_mib or not r.accepts_model(g.model):
                return False
        return True

    def _pick_for(self, r: Request) -> bool:
        """A fresh target for the next head of shape ``r``, among the GPUs no pool holds; else taken from
        the pool of a shape none of whose heads is ahead of it this step. False when there is none."""
        v = self.view
        on = self._claims_on()
        held = {u for pool in self.pools.values() for p in pool for u in p.target.gpus}
        target = pick_gpu_target(self.ledger, r, v.book.runs, v.book.history, v.now, self.s.horizon, held, on)
        if target is None:
            ahead = {u for shape, pool in self.pools.items() if shape == r or self.heads.get(shape)
                     for p in pool for u in p.target.gpus}
            target = pick_gpu_target(self.ledger, r, v.book.runs, v.book.history, v.now, self.s.horizon, ahead, on)
            if target is None:
                return False
            lost = set(target.gpus)
            for shape in list(self.pools):
                self.pools[shape] = [p for p in self.pools[shape] if not lost & set(p.target.gpus)]
        for u in target.gpus:
            self.holds.hold(u)
        self.pools.setdefault(r, []).append(_Pooled(target, v.now))
        return True

    def _steered(self, w: WaitingClaim) -> bool:
        """Where targets steer rather than hold (``Holding.strict`` False): start ``w``, which fits on no
        GPU off the held targets, on a target of another shape than the front's if one takes it. Cost: one
        lift and hold of those targets' GPUs and one placement."""
        if self.strict:
            return False
        shape = self.front
        held = shape is not None and self._front_horizon() is None  # else the front's targets steer too
        front = {u for _, p in self._front_pools() for u in p.target.gpus} if held else set()
        soft = [u for pool in self.pools.values() for p in pool for u in p.target.gpus
                if u in self.holds and u not in front]
        if not soft:
            return False
        with self.holds.lifted_meanwhile(soft):
            choice = self.view.choose(w.request)
            if choice is None:
                return False
            self.out.append(self.view.admit(w.claim, choice))
            return True

    def _front_horizon(self) -> float | None:
        """None once the front's targets are held; else the horizon within which none of them likely frees
        yet (they steer meanwhile). Memoised per step until an admission or a lift changes the GPUs."""
        shape = self.front
        heads = self.heads.get(shape) if shape is not None else None
        if shape is None or not heads:
            return None
        pools = self._front_pools()
        key = (len(self.out), self.holds.lifted, len(pools))
        if self._pending is not None and self._pending[0] == key:
            return self._pending[1]
        holding = self.s.holding
        within = holding.front_horizon(self.view, heads[0])
        if within is not None:
            horizon = max(self.s.horizon, within)
            sure = holding.front_sure(self.view, heads[0])
            by = self.view.now + max(horizon, sure or 0.0)  # declared ends alone free it by then: sure to hold
            scored = (self._rescored(r, p.target, horizon) for r, p in pools)
            ready = any(t.chance >= FRONT_CHANCE or (t.drains_by is not None and t.drains_by <= by) for t in scored)
            within = None if ready else horizon
        self._pending = (key, within)
        return within

    # ---- 3: everyone else -------------------------------------------------------------------------

    def _best_effort_pass(self) -> None:
        v = self.view
        walk = v.walk()
        while (item := walk.pop()) is not None:
            key, shape, cls = item
            r = shape.request
            if self._failed(r) or not self._satisfiable(r):
                continue
            if v.over_entitlement(cls):
                walk.advance(shape, key)
                continue
            choice = v.choose(r)
            if choice is None:
                if self._steered(v.claim_at(key)):
                    walk.advance(shape, key)
                    continue
                self.failed[r] = self.holds.lifted
                continue
            self.out.append(v.admit(v.claim_at(key).claim, choice))
            walk.advance(shape, key)

    # ---- 4: backfill -----------------------------------------------------------------------------------

    def _backfill(self) -> None:
        v = self.view
        if not self.pools or v.order.limited == 0:
            return
        heads = {w.claim for ws in self.heads.values() for w in ws}
        now = [self._rescored(shape, p.target) for shape, pool in self.pools.items() for p in pool]
        timed = sorted((t for t in now if t.drains_by is not None and t.drains_by > v.now),
                       key=lambda t: t.drains_by or 0.0)
        if not timed:
            return
        latest = max(t.drains_by or 0.0 for t in timed)
        bound = latest - v.now - v.slack + 1e-6  # a longer declared limit ends after every target frees
        classes = v.order.classes
        heap: list[tuple[tuple[int, float, Key], int, int]] = []  # ((priority, limit, key), cid, index)
        for cls in classes.values():
            r = cls.shape
            if cls.limits and cls.limits[0][0] <= bound and r.count == 1:
                heap.append(((cls.keys[0][0], cls.limits[0][0], cls.limits[0][1]), cls.cid, 0))
        heapq.heapify(heap)
        while heap:
            _, cid, j = heapq.heappop(heap)
            found = classes.get(cid)
            if found is None or j >= len(found.limits) or v.over_entitlement(found):
                continue
            cls = found
            _, key = cls.limits[j]
            w = v.claim_at(key)
            nxt = j
            if w.claim in heads:
                nxt = j + 1
            elif not self._backfill_one(w, timed):
                continue  # no room, or every later claim of the class declares longer: drop the class
            if nxt < len(cls.limits) and cls.limits[nxt][0] <= bound:
                lim, k = cls.limits[nxt]
                heapq.heappush(heap, ((k[0], lim, k), cid, nxt))

    def _backfill_one(self, w: WaitingClaim, timed: list[GpuTarget]) -> bool:
        """Start ``w`` on a GPU of a target it surely ends before; False when none has room."""
        r = w.request
        for t in timed:
            if not self.view.ends_by(w, t.drains_by):
                continue
            node = self.ledger.nodes[t.node]
            if not node.allows(r):
                continue
            for u in t.gpus:
                g = self.ledger.gpus[u]
                self.holds.lift(u)
                ok = self.ledger.host_fits(node, r) and self.ledger.gpu_fits(g, r) and (g.empty or not r.whole)
                if ok:
                    self.out.append(self.view.admit_on(w.claim, t.node, (u,), backfill=True))
                self.holds.hold(u)
                if ok:
                    return True
        return False


class _DrainLens:
    """Explain under drain-soonest, from the heads and targets of the last step. Where targets steer
    (``Holding.strict`` False) only those of the front's shape are held: a head of another shape is told
    its GPUs are steered for it, and a claim that fits only on those starts there (it is not blocked)."""

    def __init__(self, strategy: DrainSoonest, view: AdmissionView,
                 words: HeadWords | None = None) -> None:
        self.view = view
        self.words = words or _DRAIN_WORDS
        ledger = view.ledger
        heads = {c: h for c, h in strategy._heads.items() if c in view.order and h.target.node in ledger.nodes
                 and all(u in ledger.gpus for u in h.target.gpus)}
        on = claims_by_gpu(ledger) if heads else {}
        self.heads = {c: _Head(h.claim, gpu_target(ledger, h.claim.request, h.target.node, h.target.gpus, on,
                                                   view.book.runs, view.book.history, view.now, strategy.horizon))
                      for c, h in heads.items()}
        strict = strategy.holding.strict
        self.pending = strategy._front_pending  # the front steers until a target likely frees within this
        self.front = strategy._front
        self.held_by = {c: h for c, h in self.heads.items()
                        if strict or (self.pending is None and asks_same(h.claim.request, self.front))}
        self.held = {u for h in self.held_by.values() for u in h.target.gpus}
        self._outside: dict[Request, bool] = {}

    def where(self, t: GpuTarget) -> str:
        gpus = self.view.ledger.gpus
        cards = ", ".join(str(gpus[u].index) for u in t.gpus if u in gpus)
        return f"GPU {cards} of node {t.node}" if len(t.gpus) == 1 else f"GPUs {cards} of node {t.node}"

    def see(self, w: WaitingClaim, fit: bool, message: str) -> tuple[str, str, float | None] | None:
        v = self.view
        head = self.heads.get(w.claim)
        if head is not None:
            t = head.target
            if w.claim in self.held_by:
                need = message if not fit else "fits only on GPUs held for claims ahead of it"
                text = self.words.held(w, self.where(t), v.now, t.drains_by, v.limit_of(w))
                return WAITING_FOR_RESERVATION, f"{need}; {text}", t.drains_by
            if not fit and self.pending is not None and asks_same(w.request, self.front):  # the front's ask, not held
                return NO_CAPACITY, f"{message}; {front_pending_message(w, self.where(t), v.now, self.pending)}", None
            if not fit:  # it steers: nothing is reserved for it
                return NO_CAPACITY, f"{message}; {self.words.steered(w, self.where(t), v.now)}", None
            # a steered head that fits: the step starts it only off the held GPUs, as any other claim
        if not fit or not self.held or self._fits_outside(w.request):
            return None
        on = [h for h in self.held_by.values() if self._fits_on(w.request, h.target)]
        if w.request.count == 1 and any(v.ends_by(w, h.target.drains_by) for h in on):
            return None  # it may start there (backfill): it ends before the target frees
        first = on[0] if on else next(iter(self.held_by.values()))
        t = first.target
        text = self.words.blocked(first.claim, self.where(t), v.now, t.drains_by, v.limit_of(first.claim))
        return BLOCKED_BY_HEAD_OF_LINE, text, None

    def _fits_outside(self, r: Request) -> bool:
        """Does ``r`` fit now on GPUs no head holds, on a node its pod may use?"""
        if r not in self._outside:
            self._outside[r] = fits_off(self.view.ledger, r, self.held)
        return self._outside[r]

    def _fits_on(self, r: Request, t: GpuTarget) -> bool:
        ledger = self.view.ledger
        node = ledger.nodes.get(t.node)
        if node is None or r.count > len(t.gpus) or not ledger.host_fits(node, r) or not node.allows(r):
            return False
        fitting = {g.uuid for g in ledger.fitting_gpus(node, r)}
        return sum(1 for u in t.gpus if u in fitting) >= r.count


class HeadWords(Protocol):
    """What explain tells a head, a steered head and a claim a head blocks (a strategy's own words)."""

    def held(self, w: WaitingClaim, where: str, now: float, est: float | None, age_limit: float) -> str:
        """A head whose GPUs are held for it."""

    def steered(self, w: WaitingClaim, where: str, now: float) -> str:
        """A head whose GPUs new work is steered off (nothing held)."""

    def blocked(self, head: WaitingClaim, where: str, now: float, est: float | None, age_limit: float) -> str:
        """A claim that fits only on GPUs held for ``head``."""


class _DrainWords:
    held = staticmethod(drain_message)
    blocked = staticmethod(drain_blocked_message)

    @staticmethod
    def steered(w: WaitingClaim, where: str, now: float) -> str:
        return f"new work is kept off {where} while it fits elsewhere, so it frees for this claim"


_DRAIN_WORDS: HeadWords = _DrainWords()
