"""``worst-first`` (the default): the claims that have waited longest, whatever their product, are served
first; capacity is held for the longest-waiting one and the claims asking for its GPUs, and new work is
steered off the GPUs draining for the others.

Rule, per step (``packing/QUEUE.md``, *worst-first*; measured against the goal in ``simulations/README.md``):

1. **Queue order**, every product alike: priority, then arrival (no per-product clock: a claim is in
   line for a drain target from its arrival, T = 0). A claim that fits on a GPU no target holds
   starts there, placed as under best effort.
2. **Targets.** The longest-waiting claims that fit nowhere off the targets each get a drain target,
   drain-soonest's pick (``packing.drain.pick_gpu_target``: the ``count`` GPUs of one node likeliest
   to free for it within 30 min), while the targets take at most one GPU in ``HOLD_SHARE`` (4; at most
   64). A claim of several cards gets one only once it has waited longer than its **hold clock**

       H(k) = min(MAX_CLOCK, max over every other product j of p99_j)

   where p99_j is product j's p99 wait over its last 500 admissions (``packing.wait_history``; 0
   before any other product has 20): a multi-card target idles whole cards while it drains, a
   single-GPU target only its free share, so a multi-card claim holds only once it is the worst off.
3. **The front holds, the rest steer.** The step's first head (the longest-waiting claim that got a
   target, higher priority first) is the **front**: the targets of the heads asking for the GPUs it asks
   (``drain_soonest.gpu_ask``: host CPU, memory and node constraints aside), one per head, are held:
   nothing starts there unless its declared limit ends before they free (backfill, as drain-soonest).
   The targets of every other head **steer**: new work
   goes onto them only when it fits nowhere else, so they drain while nothing is idled. A front of
   several cards is held only once one of its targets likely (1/2) frees within

       W = max(30 min, min(HOLD_WITHIN x its wait, HOLD_IDLE x H))

   (R = 1, K = 2), or its claims' declared ends alone free it within R x its wait; until then its
   targets steer too, so the cards a hold idles stay idle about as long as the claim has already
   waited and at most about twice as long as the other products' tail, not for the two days a long
   job may still run.
   The held targets take at most one GPU in ``FRONT_SHARE`` (8; the front's own always): the other
   claims of the front's shape wait in line, and the room is left to the shapes that steer. A front of
   one GPU's shape holds that share only while the declared ends of the claims on a target of the front's
   alone free it (``single_front``, ``SINGLE_SURE``), else the front's own target alone: without declared
   runtimes the extra targets' drain is a guess, which cost whole cards as often as it helped them. A shape of
   several cards holds no more than the GPUs the cluster has had spare lately either
   (``packing.admission.spare``: free capacity after each step, time mean over ``SPARE_WINDOW``, 12 h):
   where there is room to spare (ρ 0.85: 83 % used, about 10 of 64 GPUs free) two 4-card targets hold,
   where there is little (ρ 0.95: about 5) only the front's own, and the smaller products keep their
   room. The front's own target always holds: the bound below does not change.

Guarantee (``packing/QUEUE.md``, *The worst-first bound*; checked against the simulation engine by
``tests/property/test_queue_bounded_wait.py``). In one priority level, on a fixed cluster without
entitlements or reservations, with a step at every arrival and departure, if every claim declares an
enforced limit of at most L: a satisfiable claim c needing a GPU starts by

    arrival_c + D_c + (A_c + 1) * L,   D_c = 0 if no claim of several cards waits ahead of it,
                                        else max(MAX_CLOCK, L / HOLD_WITHIN),

A_c being the claims ahead of c in queue order still waiting at arrival_c + D_c (a front of several
cards that has waited L / R is held by its declared ends, whatever K). Without declared limits no bound
is proven: a multi-card front holds once a target likely frees within W, an estimate from the
runtimes recorded (``packing.estimate``); protocol B measures the longest wait instead.

Cost: drain-soonest's step (best effort's walk, one pass over the class heads, a GPU scan per new
target), plus per claim that fits only on steering targets one lift and hold of their GPUs; the
clock reads a sorted window per product (O(products x log 500)), once per step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from packing.admission.drain_soonest import DEFAULT_HORIZON, DrainSoonest, asks_same
from packing.admission.spare import SpareMeter, spare_gpus
from packing.admission.view import AdmissionView
from packing.claims import WORST_FIRST, Admission, QueueError, WaitingClaim
from packing.claims import finite as _finite
from packing.claims import real as _real
from packing.claims import whole as _whole
from packing.drain import GpuTarget
from packing.explain import (
    NO_CAPACITY,
    Lens,
    front_blocked_message,
    front_message,
    steered_message,
    untargeted_message,
)
from packing.ledger import Ledger
from packing.products import Request
from packing.wait_history import WaitHistory, kind_of

HOLD_SHARE = 4  # targets take at most one GPU in this many (protocol B: one in two idled the halves' room)
MAX_CLOCK = 4 * 3600.0  # seconds: a multi-card claim's hold clock never exceeds this (the bound's D)
TAIL = 0.99  # the other products' tail a multi-card claim must pass: their p99
# a multi-card front is held once a target likely frees within this many times its wait (protocol B, 30 seeds:
# multigpu50's quarters, halves, wholes waited 101-128 min less, its 8-card jobs the same; the built-in mix alike)
HOLD_WITHIN = 1.0
# and likely within at most this many times its hold clock H, the others' tail: idled longer, they pay for it
# (protocol B, 30 seeds: multigpu50 at 0.95 quarters to whole cards waited 350-405 min less, none sacrificed
# where three were; the built-in mix at 0.85 kept its 4-card cut, 0.78 x best effort, where K = 1.5 gave 0.81)
HOLD_IDLE = 2.0
# the front's shape holds at most one GPU in this many (protocol B, 30 seeds: none sacrificed on gpushare100 at
# 0.95, the built-in mix at 0.85 and multigpu50 at 0.7, where one in four -- all the targets' cap -- sacrificed one;
# 10, 12 and 16 measured again under the gpu_ask count, 10-30 seeds: none measurably better, simulations/README.md)
FRONT_SHARE = 8
# and, for a shape of several cards, at most the GPUs the cluster had spare over about this long (seconds):
# held cards cost the others little where there is room to spare, dearly where there is none (protocol B, the
# built-in mix, 30 seeds: at 0.95 one product sacrificed, 1.06 x its limit, where four were, up to 1.91 x; at
# 1.1 its capacity back; at 0.85 its 4-card cut lost, 0.97 x best effort's where 0.78; 6 h and 24 h did worse)
SPARE_WINDOW = 12 * 3600.0
# how much the shape of a front of one GPU holds (``WorstFirstSettings.single_front``; the simulator's single=)
SINGLE_OWN = "own"  # the front's own target alone
SINGLE_SURE = "sure"  # its share while the front's own target drains by declared ends, else its own alone
SINGLE_SHARE = "share"  # its share, one GPU in FRONT_SHARE, whatever the ends
SINGLE_FRONTS = (SINGLE_OWN, SINGLE_SURE, SINGLE_SHARE)


@dataclass(frozen=True)
class WorstFirstSettings:
    """worst-first's eight settings, each its module default unless given (``ClaimQueue(worst_first=...)``; the
    simulator's ``--admission worst-first:clock=..:share=..:within=..:front=..:single=..:idle=..:spare=..:worst=..``).
    Not checked on construction: ``check`` refuses a bad one, so the queue refuses it in its own order."""

    hold_clock: float = MAX_CLOCK  # seconds: the ceiling D of the multi-card hold clock (inf: never; clock=)
    hold_share: int = HOLD_SHARE  # the targets take at most one GPU in this many (share=)
    hold_within: float = HOLD_WITHIN  # R: a multi-card front holds once one likely frees in R x its wait (within=)
    front_share: int = FRONT_SHARE  # N: the front's shape holds at most one GPU in N (front=)
    # how much a front of one GPU's shape holds: its share only while the front's own target drains by declared
    # ends (sure), else the front's own target alone (single=sure); own: always its own alone; share: always its
    # share (the default before). Protocol B: without declared runtimes the share's one measurable step from best
    # effort (gpushare40 at 0.85, 30 seeds) is gone; with them its cut stays (simulations/README.md)
    single_front: str = SINGLE_SURE
    hold_idle: float = HOLD_IDLE  # K: and within K x its hold clock H (inf: no such limit; idle=)
    # a shape of several cards holds at most the GPUs spare over about this long (None: no such limit; spare=)
    spare_window: float | None = SPARE_WINDOW
    # a what-if: the front's shape holds more than the front's own target only while its product's recent p99
    # wait is the longest of every product's (worst=on; off, the default: measured, simulations/README.md)
    front_worst: bool = False

    def check(self) -> None:
        """QueueError naming the first setting out of range, checked clock, share, front, single, within, idle,
        spare, worst (``worst_first=None`` means every default; of the fields only ``spare_window`` takes None)."""
        if not (_real(self.hold_clock) and self.hold_clock >= 0):
            raise QueueError(f"hold_clock must be a number of seconds >= 0 (inf: never), "
                             f"got {self.hold_clock!r}")
        if not (_whole(self.hold_share) and self.hold_share >= 1):
            raise QueueError(f"hold_share must be a whole number >= 1, got {self.hold_share!r}")
        if not (_whole(self.front_share) and self.front_share >= 1):
            raise QueueError(f"front_share must be a whole number >= 1, got {self.front_share!r}")
        if self.single_front not in SINGLE_FRONTS:
            raise QueueError(f"single_front must be one of {', '.join(SINGLE_FRONTS)}, got {self.single_front!r}")
        if not (_real(self.hold_within) and self.hold_within > 0):
            raise QueueError(f"hold_within must be a ratio > 0 (inf: a front holds at once), "
                             f"got {self.hold_within!r}")
        if not (_real(self.hold_idle) and self.hold_idle > 0):
            raise QueueError(f"hold_idle must be a ratio > 0 (inf: no limit by the hold clock), "
                             f"got {self.hold_idle!r}")
        if self.spare_window is not None and not (_finite(self.spare_window) and self.spare_window > 0):
            raise QueueError(f"spare_window must be a finite number of seconds > 0, or None (no limit by the "
                             f"spare capacity), got {self.spare_window!r}")
        if not isinstance(self.front_worst, bool):
            raise QueueError(f"front_worst must be True or False, got {self.front_worst!r}")


DEFAULT_SETTINGS = WorstFirstSettings()  # what ``worst_first=None`` means


class HoldClock:
    """When a claim of several cards may hold a target: once it has waited longer than every other
    product's recent p99 (``TAIL``), at most ``max_clock`` (``settings.hold_clock``, ``MAX_CLOCK`` by
    default); never with ``max_clock`` infinite (the what-if ``clock=never``: such claims are placed as
    best effort places them, with no bound). Single-GPU claims may at once. ``settings``
    (``WorstFirstSettings``; None: the defaults) also gives:

    ``hold_within`` R (``HOLD_WITHIN``; the simulator's ``within=R``): a front of several cards holds its
    targets only once one likely frees within R x the time it has waited (``front_horizon``) and within
    ``hold_idle`` K x its clock H (``HOLD_IDLE``; the simulator's ``idle=K``, ``idle=off``: no such limit),
    or its declared ends alone free it within R x that wait (``front_sure``); until then they steer.
    Infinite R (``within=off``): it holds at once.

    ``front_share`` N (``FRONT_SHARE``; the simulator's ``front=N``): the front's shape holds at most one
    GPU in N, the front's own target always (``front=4``, the targets' own cap, was the default before).
    ``single_front`` (``SINGLE_SURE``; the simulator's ``single=sure``): a front of one GPU holds that share only
    while its own target drains by declared ends (``DrainSoonest.front_declared``), else its own target
    alone; ``single=own``: its own alone always; ``single=share``: the share always (the default before).

    ``front_worst`` (the what-if ``worst=on``; off by default): that share only while the front's product is the
    worst served, its recent p99 wait the longest of every product's (``behind``); else the front's own alone."""

    strict = False  # only the targets of the front's shape are held; the others steer

    def __init__(self, tail: float = TAIL, settings: WorstFirstSettings | None = None) -> None:
        s = DEFAULT_SETTINGS if settings is None else settings
        self.tail = tail
        self.max_clock = s.hold_clock
        self.hold_within = s.hold_within
        self.hold_idle = s.hold_idle
        self.front_share = s.front_share
        self.single_front = s.single_front
        self.front_worst = s.front_worst
        self.spare = SpareMeter(s.spare_window) if s.spare_window is not None else None
        # (now, id of the history, kind -> the longest recent p99 of another product and that product)
        self._memo: tuple[float, int, dict[str, tuple[float, str | None]]] = (-1.0, -1, {})

    def may_head(self, view: AdmissionView, claim: WaitingClaim) -> bool:
        if claim.request.count <= 1:
            return True
        return view.now - claim.arrived_at >= self.clock(view.book.waits, kind_of(claim.request), view.now)

    def share(self, r: Request, declared: bool) -> int | None:
        """One GPU in how many the front's shape ``r`` holds: ``front_share``; None (the front's own target only)
        for one GPU under ``single_front`` own, or sure while not ``declared`` (declared ends alone free no
        target of the front's)."""
        if r.count <= 1 and (self.single_front == SINGLE_OWN or (self.single_front == SINGLE_SURE and not declared)):
            return None
        return self.front_share

    def front_cap(self, view: AdmissionView, r: Request, declared: bool) -> int | None:
        """The most GPUs the front's shape ``r`` holds: one in ``share(r, declared)`` (one GPU, the front's own, where
        that is None); for several cards no more than the GPUs spare lately (``spare_window``) either; with
        ``front_worst``, one (the front's own) while ``behind``."""
        share = self.share(r, declared)
        if share is None or self.behind(view, r) is not None:
            return 1  # the front's own target only (single=own or not sure, or another product is worse served)
        cap = len(view.ledger.gpus) // share
        spare = self.spare_lately(view.now) if r.count > 1 else None
        return cap if spare is None else min(cap, math.floor(spare))

    def behind(self, view: AdmissionView, r: Request) -> tuple[str, float] | None:
        """With ``front_worst``: the product, and its recent p99 wait, whose tail is longer than that of ``r``'s
        product (both from ``TAIL`` of the last admissions, ``packing.wait_history``); None when it has the longest,
        has too few admissions to say, or ``front_worst`` is off."""
        if not self.front_worst:
            return None
        kind = kind_of(r)
        own = view.book.waits.quantile(kind, self.tail)
        tail, other = self._others(view.book.waits, kind, view.now)
        if own is None or other is None or own >= tail:
            return None
        return other, tail

    def spare_lately(self, now: float) -> float | None:
        """The GPUs spare lately (``packing.admission.spare``); None without a spare window or before any step."""
        return self.spare.mean(now) if self.spare is not None else None

    def observe(self, view: AdmissionView) -> None:
        """After a step: the capacity it left spare, which stands until the next."""
        if self.spare is not None:
            self.spare.observe(view.now, spare_gpus(view.ledger))

    def front_horizon(self, view: AdmissionView, claim: WaitingClaim) -> float | None:
        """How soon the front's target must likely free before it is held: R x its wait, at most K x its clock
        H (claims of several cards); None: held at once."""
        sure = self.front_sure(view, claim)
        if sure is None or math.isinf(self.hold_idle):
            return sure
        return min(sure, self.hold_idle * self.clock(view.book.waits, kind_of(claim.request), view.now))

    def front_sure(self, view: AdmissionView, claim: WaitingClaim) -> float | None:
        """Within how long declared ends alone must free the front's target for it to be held: R x its wait
        (claims of several cards; the bound counts on it); None: held at once."""
        if math.isinf(self.hold_within) or claim.request.count <= 1:
            return None
        return self.hold_within * (view.now - claim.arrived_at)

    def clock(self, waits: WaitHistory, kind: str, now: float) -> float:
        """H(kind) at ``now``: the longest recent p99 of the other products, at most ``max_clock`` (infinite
        when ``max_clock`` is: never)."""
        if math.isinf(self.max_clock):
            return math.inf
        return min(self.max_clock, self._others(waits, kind, now)[0])

    def _others(self, waits: WaitHistory, kind: str, now: float) -> tuple[float, str | None]:
        """The longest recent p99 of a product other than ``kind`` (0 when none has enough admissions) and that
        product, memoised per step: O(products x log window) once per kind and step."""
        at, owner, memo = self._memo
        if at != now or owner != id(waits):
            memo = {}
            self._memo = (now, id(waits), memo)
        if kind not in memo:
            tails = [(t, k) for k in waits.products() if k != kind and (t := waits.quantile(k, self.tail)) is not None]
            memo[kind] = max(tails, default=(0.0, None))
        return memo[kind]


class WorstFirst:
    """The strategy object: drain-soonest's pools, targets and holds under the hold clock; the front's shape held.
    ``settings``: its ``WorstFirstSettings`` (None: the defaults), taken as given (``ClaimQueue`` checks them)."""

    name = WORST_FIRST

    def __init__(self, max_heads: int | None = None, horizon: float = DEFAULT_HORIZON, tail: float = TAIL,
                 settings: WorstFirstSettings | None = None) -> None:
        s = DEFAULT_SETTINGS if settings is None else settings
        self.clock = HoldClock(tail, s)
        self.drain = DrainSoonest(max_heads, horizon, self.clock, s.hold_share, _Words())

    @property
    def horizon(self) -> float:
        return self.drain.horizon

    def cap(self, ledger: Ledger) -> int:
        """How many GPUs the targets may take at once (the first head's always)."""
        return self.drain.cap(ledger)

    def step(self, view: AdmissionView) -> list[Admission]:
        out = self.drain.step(view)
        self.clock.observe(view)  # after the step: its holds are gone, its admissions in the ledger
        return out

    def lens(self, view: AdmissionView) -> Lens | None:
        inner = self.drain.lens(view)
        return _Lens(self, view, inner) if inner is not None else None

    def targets(self) -> dict[str, str]:
        return self.drain.targets()

    def gpu_targets(self) -> dict[str, GpuTarget]:
        """After the last step: each claim with a target -> its GPUs (held for the front's shape, steered for
        the rest)."""
        return self.drain.gpu_targets()

    def front_pending(self) -> float | None:
        """After the last step: while the front's targets steer too (several cards, none likely to free within R x
        its wait), that horizon in seconds; None once they are held (or without a front)."""
        return self.drain.front_pending()

    def front(self) -> str | None:
        """After the last step: the longest-waiting claim with a target; the targets of the claims asking for its
        GPUs are held (None without targets)."""
        return self.drain.front()

    def default_age_limit(self, request: Request) -> float:
        return 0.0  # every product in line for a target from its arrival: the order is the queue's

    def group_age_limit(self, request: Request) -> float:
        # a group's hold is strict (all its GPUs at once, nothing backfills them): the clock's ceiling D,
        # not its learned H, so a gang never holds free cards from its arrival
        return self.clock.max_clock


class _Words:
    """What explain says under worst-first (``packing.admission.drain_soonest.HeadWords``)."""

    held = staticmethod(front_message)
    steered = staticmethod(steered_message)
    blocked = staticmethod(front_blocked_message)


class _Lens:
    """Explain under worst-first: drain-soonest's lens for the claims with targets and those a held target
    blocks; a claim that fits nowhere and has no target is also told why claims after it may start
    first and when it gets a target."""

    def __init__(self, strategy: WorstFirst, view: AdmissionView, inner: Lens) -> None:
        self.strategy = strategy
        self.view = view
        self.inner = inner
        self.targets = len(strategy.gpu_targets())
        self.capped = strategy.drain.front_full(view)

    def see(self, w: WaitingClaim, fit: bool, message: str) -> tuple[str, str, float | None] | None:
        said = self.inner.see(w, fit, message)
        if said is not None or fit or w.request.gpu_less:
            return said
        v = self.view
        r = w.request
        clock = None
        if r.count > 1:
            h = self.strategy.clock.clock(v.book.waits, kind_of(r), v.now)
            clock = h if v.now - w.arrived_at < h else None
        hc = self.strategy.clock
        capped = asks_same(r, self.capped)
        declared = self.strategy.drain.front_declared()
        share = hc.share(r, declared) if capped else None
        behind = hc.behind(v, r) if share is not None else None
        spare = None  # the spare cap, where it and not the share set how many hold
        if share is not None and behind is None:
            cap = hc.front_cap(v, r, declared)
            spare = cap if cap is not None and cap < len(v.ledger.gpus) // share else None
        own = capped and share is None
        why = untargeted_message(self.targets, clock, share, spare, behind, own=own,
                                 unsure=own and hc.single_front == SINGLE_SURE)
        return NO_CAPACITY, f"{message}; {why}", None
