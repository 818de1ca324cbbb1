"""``drain-soonest``: claims past their product's aging clock go first, and each that does not fit
holds the GPUs that should free up for it soonest.

Rule, per step:

1. **Starving first.** A claim *starves* once it has waited longer than its product's age limit T
   (``age_limits``, per product: the per-product aging clock). Starving claims are taken first,
   by priority, then by the time they started starving (arrival + T), then arrival order.
2. **Heads.** A starving claim (within its entitlement, satisfiable) that fits on no GPU outside
   the drain targets is a *head*, up to ``cap`` heads in all. The heads of one request shape share
   a pool of drain targets, one per head: ``count`` GPUs of one node each, picked
   (``packing.drain.pick_gpu_target``) as the likeliest to hold the head soonest -- by declared ends
   where the claims there declare limits, else by ``RuntimeHistory`` from the runtimes seen. A
   target is kept while heads of its shape starve; when one can hold the shape, the oldest head
   of that shape starts on it.
3. **Everyone else** is placed as best effort does, in queue order, anywhere but on the targets:
   the free capacity of every target is held in the ledger for the step (``packing.admission.holds``).
4. **Backfill.** On a target whose declared ends free it by D, a waiting claim may start if its own
   declared limit (plus the reservation TTL) ends by D: priority, then the shortest limit, then
   arrival.

Guarantee (the proof is in ``packing/QUEUE.md``; ``tests/property/test_queue_bounded_wait.py``
checks it against the simulation engine). Within one priority level, with no higher-priority
arrivals, a fixed cluster and no entitlement changes: if every running and arriving claim declares
an enforced limit of at most L, a claim c that is within its entitlement and satisfiable starts by
``arrived + T_c + (A_c + 1) * L``, where A_c is the number of claims that started starving no later
than c and still waited when c did. In words: once a claim has waited T, each period of L starts at
least one of the claims that starve before it, so its wait is bounded; without declared limits the
same holds with L the longest runtime. Placements that fit never wait for a head that is not
ahead of them in starving order, so outside the targets it is best effort.

Cost: a step costs what best effort costs, plus one pass over the starving class heads, plus per
new head one scan of the GPUs (O(GPUs + running claims)); backfill looks at classes declaring
limits only when a target has a declared drain.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from packing.admission.holds import Holds, is_hold
from packing.admission.view import AdmissionView
from packing.claims import DRAIN_SOONEST, Admission, WaitingClaim
from packing.drain import GpuTarget, claims_by_gpu, gpu_target, pick_gpu_target
from packing.explain import (
    BLOCKED_BY_HEAD_OF_LINE,
    WAITING_FOR_RESERVATION,
    Lens,
    drain_blocked_message,
    drain_message,
)
from packing.ledger import Allocation, Ledger
from packing.products import Request
from packing.waiting_order import ClaimClass, Key

DEFAULT_HORIZON = 1800.0  # seconds: "likeliest to hold the head within half an hour"
HEAD_SHARE = 4  # by default at most one head per this many GPUs: most of the cluster keeps taking work

StarveKey = tuple[int, float, int]  # (-priority, arrived_at + T, seq)


@dataclass(frozen=True, slots=True)
class _Head:
    claim: WaitingClaim
    target: GpuTarget


class DrainSoonest:
    """The strategy object: it keeps each head's drain target between steps."""

    name = DRAIN_SOONEST

    def __init__(self, max_heads: int | None = None, horizon: float = DEFAULT_HORIZON) -> None:
        self.max_heads = max_heads
        self.horizon = horizon
        self._heads: dict[str, _Head] = {}  # after the last step: head -> its target

    def cap(self, ledger: Ledger) -> int:
        """How many heads may hold a target at once: ``max_heads``, by default one per four GPUs."""
        if self.max_heads is not None:
            return self.max_heads
        return max(1, len(ledger.gpus) // HEAD_SHARE)

    def targets(self) -> dict[str, str]:
        return {c: h.target.node for c, h in self._heads.items()}

    def gpu_targets(self) -> dict[str, GpuTarget]:
        """After the last step: each head -> the GPUs held for it and how soon they should free."""
        return {c: h.target for c, h in self._heads.items()}

    # ---- the step -----------------------------------------------------------------------------------

    def step(self, view: AdmissionView) -> list[Admission]:
        holds = Holds(view.ledger)
        try:
            return _Step(self, view, holds).run()
        finally:
            holds.release_all()

    def lens(self, view: AdmissionView) -> Lens | None:
        return _DrainLens(self, view)


class _Step:
    """One step of drain-soonest: what it has decided so far."""

    def __init__(self, strategy: DrainSoonest, view: AdmissionView, holds: Holds) -> None:
        self.s = strategy
        self.view = view
        self.ledger = view.ledger
        self.holds = holds
        self.out: list[Admission] = []
        self.failed: set[Request] = set()  # shapes that fit nowhere outside the targets this step
        self.heads: dict[str, _Head] = {}  # this step's heads, in starving order
        self.claimed: set[str] = set()  # GPUs of this step's heads' targets
        self._on: dict[str, list[Allocation]] | None = None
        self._on_at = -1
        self.owned: dict[str, GpuTarget] = {}  # last step's heads still waiting -> their targets
        self.spare: dict[Request, list[GpuTarget]] = {}  # last step's targets whose heads left, by shape
        self._carry_over()

    def run(self) -> list[Admission]:
        for t in [*self.owned.values(), *(t for p in self.spare.values() for t in p)]:
            for u in t.gpus:
                self.holds.hold(u)
        self._starving_pass()
        self._best_effort_pass()
        self._backfill()
        self.s._heads = self.heads
        return self.out

    # ---- last step's targets -------------------------------------------------------------------

    def _claims_on(self) -> dict[str, list[Allocation]]:
        """Claims by GPU (holds left out), rebuilt once something was admitted since."""
        if self._on is None or self._on_at != len(self.out):
            skip = {a for a in self.ledger.allocations if is_hold(a)}
            self._on = claims_by_gpu(self.ledger, skip)
            self._on_at = len(self.out)
        return self._on

    def _carry_over(self) -> None:
        """Last step's targets still in the ledger, re-scored: each still-waiting head keeps its own;
        the targets of heads that left are spares for the next heads of their shape, soonest first."""
        v = self.view
        ledger = self.ledger
        for claim, head in self.s._heads.items():
            t = head.target
            if t.node not in ledger.nodes or any(u not in ledger.gpus or ledger.gpus[u].node != t.node
                                                 for u in t.gpus):
                continue
            shape = head.claim.request
            t = gpu_target(ledger, shape, t.node, t.gpus, self._claims_on(), v.book.runs, v.book.history, v.now,
                           self.s.horizon)
            if claim in v.order:
                self.owned[claim] = t
            else:
                self.spare.setdefault(shape, []).append(t)
        for pool in self.spare.values():
            pool.sort(key=lambda t: t.order(ledger.nodes[t.node].order))

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
            if not v.satisfiable(r) or v.over_entitlement(cls):
                continue  # the whole class: it never fits, or usage only grows within a step
            w = v.claim_at(cls.keys[i])
            if r not in self.failed:
                choice = v.choose(r)
                if choice is not None:
                    self._admit(w, choice.node, choice.gpus)
                    self._offer(heap, cls, i, push=True)
                    continue
                self.failed.add(r)
            if r.gpu_less or len(self.heads) >= cap:
                continue  # no more heads: the class cannot start this step
            if self._start_on_ready_target(w):
                self._offer(heap, cls, i, push=True)
                continue
            target = self._target_for(w)
            if target is not None:
                for u in target.gpus:
                    self.claimed.add(u)
                    self.holds.hold(u)
                self.heads[w.claim] = _Head(w, target)
            self._offer(heap, cls, i + 1, push=True)

    def _offer(self, heap: list[tuple[StarveKey, int, int]], cls: ClaimClass, i: int, push: bool = False) -> None:
        """Offer the ``i``-th claim of ``cls`` if it starves (the later ones starve later)."""
        if i >= len(cls.keys):
            return
        key: Key = cls.keys[i]
        limit = self.view.age_limit(self.view.claim_at(key).product)
        if self.view.now - key[1] <= limit:
            return
        item = ((key[0], key[1] + limit, key[2]), cls.cid, i)
        if push:
            heapq.heappush(heap, item)
        else:
            heap.append(item)

    def _admit(self, w: WaitingClaim, node: str, gpus: tuple[str, ...], backfill: bool = False) -> None:
        """Start ``w``; a target it owned becomes a spare of its shape."""
        self.out.append(self.view.admit_on(w.claim, node, gpus, backfill))
        own = self.owned.pop(w.claim, None)
        if own is not None:
            self.spare.setdefault(w.request, []).insert(0, own)

    def _start_on_ready_target(self, w: WaitingClaim) -> bool:
        """Start head ``w`` on a target of its shape that holds it now, if any (its own first): the
        oldest head takes the first target to free. A younger head whose target it takes gets ``w``'s."""
        r = w.request
        own = self.owned.get(w.claim)
        others = [(c, t) for c, t in self.owned.items() if c != w.claim and self.view.order.get(c) is not None
                  and self.view.order.entries[c][0].request == r]
        choices: list[tuple[str | None, GpuTarget]] = [(w.claim, own)] if own is not None else []
        choices += [(None, t) for t in self.spare.get(r, [])] + [(c, t) for c, t in others]
        for owner, t in choices:
            if not self._holds_now(r, t):
                continue
            for u in t.gpus:
                self.holds.lift(u)
            if owner is None:
                self.spare[r].remove(t)
            elif owner != w.claim:
                del self.owned[owner]
                if own is not None:
                    self.owned[owner] = own  # the younger head takes over the older one's target
            self.out.append(self.view.admit_on(w.claim, t.node, t.gpus))
            self.owned.pop(w.claim, None)
            return True
        return False

    def _holds_now(self, r: Request, t: GpuTarget) -> bool:
        """Would ``t``, without its holds, take ``r`` now?"""
        node = self.ledger.nodes[t.node]
        if not self.ledger.host_fits(node, r):
            return False
        for u in t.gpus:
            g = self.ledger.gpus[u]
            milli, mib = self.holds.free(g)
            if r.whole and (milli != g.milli or mib != g.memory_mib):
                return False
            if milli < r.milli or mib < r.memory_mib or not r.accepts_model(g.model):
                return False
        return True

    def _target_for(self, w: WaitingClaim) -> GpuTarget | None:
        """Head ``w``'s target: its own from the last step; else a spare of its shape; else a fresh pick
        among the GPUs no target holds; else one taken from the spares or from a head behind it."""
        own = self.owned.pop(w.claim, None)
        if own is not None:
            return own
        r = w.request
        pool = self.spare.get(r)
        if pool:
            return pool.pop(0)
        v = self.view
        on = self._claims_on()
        others = {u for t in self.owned.values() for u in t.gpus}
        spares = {u for p in self.spare.values() for t in p for u in t.gpus}
        for taken in (self.claimed | others | spares, self.claimed | others, self.claimed):
            target = pick_gpu_target(self.ledger, r, v.book.runs, v.book.history, v.now, self.s.horizon, taken, on)
            if target is not None:
                break
        if target is None:
            return None
        lost = set(target.gpus)
        for shape, p in self.spare.items():
            self.spare[shape] = [t for t in p if not lost & set(t.gpus)]
        for c in [c for c, t in self.owned.items() if lost & set(t.gpus)]:
            del self.owned[c]  # a head behind this one: it picks afresh at its turn
        return target

    # ---- 3: everyone else -------------------------------------------------------------------------

    def _best_effort_pass(self) -> None:
        v = self.view
        walk = v.walk()
        while (item := walk.pop()) is not None:
            key, shape, cls = item
            r = shape.request
            if r in self.failed or not v.satisfiable(r):
                continue
            if v.over_entitlement(cls):
                walk.advance(shape, key)
                continue
            choice = v.choose(r)
            if choice is None:
                self.failed.add(r)
                continue
            self._admit(v.claim_at(key), choice.node, choice.gpus)
            walk.advance(shape, key)

    # ---- 4: backfill -----------------------------------------------------------------------------------

    def _backfill(self) -> None:
        v = self.view
        timed = sorted((h.target for h in self.heads.values() if h.target.drains_by is not None
                        and h.target.drains_by > v.now), key=lambda t: t.drains_by or 0.0)
        if not timed or v.order.limited == 0:
            return
        latest = max(t.drains_by or 0.0 for t in timed)
        bound = latest - v.now - v.slack + 1e-6  # a longer declared limit ends after every target frees
        classes = v.order.classes
        heap: list[tuple[tuple[int, float, Key], int, int]] = []  # ((priority, limit, key), cid, index)
        for cls in classes.values():
            r = cls.shape
            if cls.limits and cls.limits[0][0] <= bound and r.count == 1 and not r.whole:
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
            if w.claim in self.heads:
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
                return False  # targets are sorted by drain: the later ones free later still
            node = self.ledger.nodes[t.node]
            for u in t.gpus:
                g = self.ledger.gpus[u]
                self.holds.lift(u)
                ok = self.ledger.host_fits(node, r) and self.ledger.gpu_fits(g, r)
                if ok:
                    self._admit(w, t.node, (u,), backfill=True)
                self.holds.hold(u)
                if ok:
                    return True
        return False


class _DrainLens:
    """Explain under drain-soonest, from the heads and targets of the last step."""

    def __init__(self, strategy: DrainSoonest, view: AdmissionView) -> None:
        self.view = view
        self.heads = {c: h for c, h in strategy._heads.items() if c in view.order}
        self.held = {u for h in self.heads.values() for u in h.target.gpus}
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
            need = message if not fit else "fits only on GPUs held for claims ahead of it"
            text = drain_message(w, self.where(t), v.now, t.drains_by, v.age_limit(w.product))
            return WAITING_FOR_RESERVATION, f"{need}; {text}", t.drains_by
        if not fit or not self.held or self._fits_outside(w.request):
            return None
        on = [h for h in self.heads.values() if self._fits_on(w.request, h.target)]
        if any(v.ends_by(w, h.target.drains_by) for h in on):
            return None  # it may start there: it ends before the target frees
        first = on[0] if on else next(iter(self.heads.values()))
        t = first.target
        text = drain_blocked_message(first.claim, self.where(t), v.now, t.drains_by,
                                     v.age_limit(first.claim.product))
        return BLOCKED_BY_HEAD_OF_LINE, text, None

    def _fits_outside(self, r: Request) -> bool:
        """Does ``r`` fit now on GPUs no head holds?"""
        if r not in self._outside:
            ledger = self.view.ledger
            self._outside[r] = any(
                ledger.host_fits(n, r) and (r.gpu_less or sum(1 for g in ledger.fitting_gpus(n, r)
                                                              if g.uuid not in self.held) >= r.count)
                for n in ledger.nodes.values())
        return self._outside[r]

    def _fits_on(self, r: Request, t: GpuTarget) -> bool:
        ledger = self.view.ledger
        node = ledger.nodes.get(t.node)
        if node is None or r.count > len(t.gpus) or not ledger.host_fits(node, r):
            return False
        fitting = {g.uuid for g in ledger.fitting_gpus(node, r)}
        return sum(1 for u in t.gpus if u in fitting) >= r.count
