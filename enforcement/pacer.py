"""The share pacer: a per-GPU control loop that decides, every slot, which slice holders to freeze.

Pure: no I/O, no clock of its own. The agent feeds it measured GPU time per holder
(:meth:`GpuPacer.observe`, from NVML per-process samples), the GPU's own busy fraction
(:meth:`GpuPacer.observe_busy`), and asks it for the frozen set of the next slot
(:meth:`GpuPacer.decide`). The controller is a **demand-aware deficit bucket**:

* **Targets.** Among the *active* holders (GPU time seen within ``active_window_s``), targets are a
  weighted water-fill of the GPU by entitlement, each holder capped by its estimated demand: a
  holder that cannot use its share leaves the rest to the others.
* **Demand, on evidence only.** A holder is *limited* (demand = what it used) when it ran through
  windows in which the GPU had idle time while it could run (coarse: a window under
  ``1 - idle_margin`` busy beyond the time it was frozen; fine: GPU-level idle beyond 1 % summed
  while it was thawed and someone else was frozen), or when, thawed, it got less than
  ``(1 - margin)`` of its equal share of native time-slicing (one slice per *context* among the
  contending contexts). Otherwise it is *hungry* (demand 1). What such evidence shows it uses with
  room to spare is its ``fill``, which work conservation relies on; a limited holder crowded out
  below its demand on a busy GPU gets its entitlement as target again but keeps its fill. Fill
  and demand return to 1 when it is seen using more, or after ``relearn_s`` without new evidence
  (busy windows cannot tell "wants no more" from "gets no more", so it is tested again).
* **Bucket (integral action).** Per measured window, ``b_i += share_i * busy - used_i`` where
  ``busy`` is the GPU time the paced holders used together, so the buckets sum to zero and NVML's
  integer-percent quantisation cannot make them drift. ``b_i`` is clamped to ``[-B_i, +B_i]`` with
  ``B_i = burst_s * weight_i``; credit a *limited* holder cannot use overflows to the others by
  weight (a hungry holder's overflow is dropped, or it could never be throttled back).
* **Prediction.** NVML reports per window and late (up to a window plus a delay), so decisions
  use ``b_i`` plus the *predicted* change over the slots not yet measured (native split among the
  thawed by contexts, capped by fill): a Smith predictor, which keeps the lag from overshooting.
* **Decision.** Thaw holders with positive (predicted) credit, holders in their start-up grace,
  and any holder that would otherwise stay frozen longer than ``max_freeze_s``. Then, while the
  thawed holders' summed fill is below one GPU, thaw the one with the most credit per weight:
  pacing never idles the GPU on purpose. A fill can be overestimated where no evidence reached it
  (two holders frozen in turns, slot by slot, are never thawed through a whole busy sample), so
  GPU idle beyond the floor while someone was frozen is also averaged for the GPU as a whole
  (``waste``, a leak of ``waste_memory_s``: sustained idle, not the transients of a freeze); past
  ``waste_share`` one holder more than the fills ask for is thawed until the average falls back,
  which bounds that idle near ``waste_share`` (plus the 1 % floor, within S2's ``eta``). With one
  active holder (or none), everything is thawed.

**Guarantees** (each checked by a property test against the simulated GPU, see README.md for the
measured figures): no freeze lasts longer than ``max_freeze_s``, so every demanding holder runs
at least once per ``max_freeze_s + slot_s`` (well inside a period); a lone busy holder is never
frozen; with total demand of at least one GPU the GPU stays busy within ``eta = 0.03``; under
sustained contention each holder's share over a 30 s window (after warm-up) is within
``eps(q) = 0.03 + 0.02 * q / slot_s`` of its target, where ``q`` is the holder's launch-queue depth:
work already queued when a freeze lands still runs (the drain lag), and the bound
``max_freeze_s`` caps how hard a holder with deep queues or many contexts can be throttled. A
holder may exceed its target by up to ``B_i`` plus drain and measurement lag after its grace:
the "may be exceeded briefly" allowance. Evidence of demand can be wrong for up to ``relearn_s``.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)

_EPS = 1e-6  # timestamps are ~1.7e9 s, where a double resolves ~2e-7 s


@dataclass(frozen=True, slots=True)
class PacerParams:
    """The controller's knobs (defaults are the agent's)."""

    slot_s: float = 0.1  # decision granularity: freeze/thaw happens on slot boundaries
    period_s: float = 1.0  # control period: liveness is judged per period
    max_freeze_s: float = 0.3  # no holder stays frozen longer (liveness probes default to 1 s)
    burst_s: float = 2.0  # bucket bound B_i = burst_s * weight_i (GPU-seconds)
    grace_s: float = 30.0  # a new holder is not paced at all for this long (start-up burst)
    active_window_s: float = 2.0  # a holder with no GPU time for this long is idle, not paced
    epoch_s: float = 1.0  # demand estimates are revised once per this much measured time
    margin: float = 0.2  # relative tolerance of the demand test (quantisation, drain)
    headroom: float = 0.02  # absolute share a limited holder may grow into before it is re-tested
    min_thawed_fraction: float = 0.3  # the demand test needs the holder thawed this much of an epoch
    idle_margin: float = 0.1  # a window with the GPU busy less than (1 - this) had idle time
    idle_evidence_s: float = 0.2  # thawed time in idle windows that proves a holder's demand
    relearn_s: float = 30.0  # demand evidence older than this is dropped and the holder tested again
    freeze_idle_s: float = 0.05  # idle GPU time (leaky sum) while someone was frozen that proves the rest
    idle_memory_s: float = 2.0  # time constant of that leaky sum
    waste_memory_s: float = 10.0  # time constant of the GPU's idle-beside-freezes average (sustained, not transients)
    waste_share: float = 0.015  # that average past which one more is thawed (+1 % floor: S2's eta of 0.03 holds)
    busy_span_s: float = 1.2  # what one GPU busy sample may cover: NVML's window (up to 1 s) plus its delay
    recent_s: float = 3.0  # how far back "while someone was frozen" looks (NVML windows and delay)
    report_window_s: float = 10.0  # measured share in views() is over this window
    log_s: float = 8.0  # how much slot history is kept to line measurements up with decisions

    def __post_init__(self) -> None:
        if self.slot_s <= 0 or self.period_s < self.slot_s:
            raise ValueError(f"need 0 < slot_s <= period_s, got {self.slot_s}, {self.period_s}")
        if not self.slot_s <= self.max_freeze_s < self.period_s:
            raise ValueError(f"max_freeze_s must be at least one slot and less than a period, got {self.max_freeze_s}")
        if self.burst_s <= 0 or self.grace_s < 0 or self.active_window_s <= self.max_freeze_s:
            raise ValueError("burst_s must be positive, grace_s non-negative, active_window_s above max_freeze_s")
        if not 0 < self.margin < 1 or self.headroom < 0 or not 0 < self.min_thawed_fraction <= 1:
            raise ValueError("margin in (0, 1), headroom >= 0, min_thawed_fraction in (0, 1]")
        if self.waste_memory_s <= 0 or not 0 < self.waste_share < 1:
            raise ValueError(
                f"need waste_memory_s > 0 and waste_share in (0, 1), got {self.waste_memory_s}, {self.waste_share}"
            )


def waterfill(weights: Mapping[K, float], caps: Mapping[K, float], total: float = 1.0) -> dict[K, float]:
    """Split ``total`` in proportion to ``weights``, none above its cap, the excess to the others.

    Progressive filling: handled in order of cap/weight, each gets the lesser of its cap and its
    weighted part of what is left. The sum is ``min(total, sum of caps)``.
    """
    alloc: dict[K, float] = {k: 0.0 for k in weights}
    order = sorted((k for k in weights if weights[k] > 0), key=lambda k: caps[k] / weights[k])
    remaining, weight_left = total, sum(weights[k] for k in order)
    for k in order:
        give = min(caps[k], remaining * weights[k] / weight_left) if weight_left > 0 else 0.0
        alloc[k] = max(give, 0.0)
        remaining -= alloc[k]
        weight_left -= weights[k]
    return alloc


@dataclass(slots=True)
class _Slot(Generic[K]):
    t0: float
    t1: float
    thawed: frozenset[K]
    any_frozen: bool
    contending: int
    share: dict[K, float]
    pred: dict[K, float]


@dataclass(slots=True)
class _Holder:
    weight: float
    paced: bool
    contexts: int
    burst: float
    bucket: float
    grace_until: float
    demand: float = 1.0
    limited: bool = False
    fill: float = 1.0
    last_active: float | None = None
    frozen_since: float | None = None
    frozen_total: float = 0.0
    target: float = 0.0
    confirmed_at: float = 0.0
    acc_used: float = 0.0
    acc_thawed: float = 0.0
    acc_fair: float = 0.0
    idle_used: float = 0.0
    idle_thawed: float = 0.0
    freeze_idle: float = 0.0  # leaky sum of GPU idle seen while it could run and someone was frozen
    history: deque[tuple[float, float, float]] = field(default_factory=deque)
    recent: deque[tuple[float, float, float, float]] = field(default_factory=deque)


@dataclass(frozen=True, slots=True)
class HolderView:
    """What the pacer knows about one holder (for metrics and the live table)."""

    weight: float
    target: float
    measured: float
    bucket: float
    burst: float
    demand: float
    limited: bool
    frozen: bool
    frozen_total_s: float
    in_grace: bool
    active: bool


@dataclass(frozen=True, slots=True)
class Member:
    """A holder present on the GPU: entitlement (milli), whether it may be paced, its GPU contexts.

    ``contexts`` (its processes on the GPU) matters because the GPU time-slices per context: a
    holder with two processes gets two slices of the native round robin.
    """

    weight: int
    paced: bool = True
    contexts: int = 1


class GpuPacer(Generic[K]):
    """The controller for one GPU. Keys are opaque holder identities."""

    def __init__(self, params: PacerParams | None = None) -> None:
        self.params = params or PacerParams()
        self.holders: dict[K, _Holder] = {}
        self.log: deque[_Slot[K]] = deque()
        self.measured_until = float("-inf")
        self.epoch_span = 0.0
        self.engaged = False
        self.epoch_busy = 0.0
        self._busy_at: float | None = None
        self._recent_freezing: deque[tuple[float, float]] = deque()
        self.waste = 0.0  # leaky sum of GPU idle beyond the floor while someone was frozen recently
        self.backstop_slots = 0  # slots in which one more was thawed than the fills asked for

    # --- measurement ---------------------------------------------------------------------------
    def observe(self, t0: float, t1: float, used: Mapping[K, float], busy: float | None = None) -> None:
        """One measured window ``[t0, t1]``: GPU-seconds each holder used in it (absent = 0).

        ``busy`` is the GPU time everyone used in the window, unmanaged processes included
        (default: the holders' sum); a window with much idle time is evidence of demand.
        """
        length = t1 - t0
        if length <= _EPS or t1 <= self.measured_until:
            return
        p = self.params
        entitled: dict[K, float] = {}
        thawed: dict[K, float] = {k: 0.0 for k in self.holders}
        fair: dict[K, float] = {k: 0.0 for k in self.holders}
        beside_frozen: dict[K, float] = {k: 0.0 for k in self.holders}
        covered = freezing = 0.0
        for slot in self.log:
            overlap = min(t1, slot.t1) - max(t0, slot.t0)
            if overlap <= 0:
                continue
            covered += overlap
            if slot.any_frozen:
                freezing += overlap
                for k in slot.thawed:
                    if k in beside_frozen:
                        beside_frozen[k] += overlap
            for k, s in slot.share.items():
                entitled[k] = entitled.get(k, 0.0) + s * overlap
            for k in slot.thawed:
                if k in thawed:
                    thawed[k] += overlap
                    fair[k] += overlap * self.holders[k].contexts / max(1, slot.contending)
        uncovered = max(0.0, length - covered)
        if uncovered > 0:  # before our first decision everyone was thawed, and nobody was paced
            n = max(1, sum(h.contexts for k, h in self.holders.items() if used.get(k, 0.0) >= 0.01 * length))
            for k in thawed:
                thawed[k] += uncovered
                fair[k] += uncovered * min(1.0, self.holders[k].contexts / n)
        paced = [k for k in entitled if k in self.holders]
        paced_busy = sum(used.get(k, 0.0) for k in paced)
        for k in paced:
            self.holders[k].bucket += entitled[k] / length * paced_busy - covered / length * used.get(k, 0.0)
        self._clamp(paced)
        total_busy = sum(used.values()) if busy is None else busy
        # Evidence only from windows we decided all of (not the first, partial ones).
        idle = total_busy < (1 - p.idle_margin) * length and covered >= 0.99 * length
        self._recent_freezing.append((t1, freezing))
        while self._recent_freezing and self._recent_freezing[0][0] < t1 - p.recent_s:
            self._recent_freezing.popleft()
        for k, h in self.holders.items():
            u = used.get(k, 0.0)
            if t1 < h.grace_until:
                h.bucket = h.burst  # start-up: not charged, and it leaves grace with full credit
            if u >= 0.01 * length:
                h.last_active = t1
            h.acc_used += u
            h.acc_thawed += thawed[k]
            h.acc_fair += fair[k]
            # Idle that its own freezes explain says nothing of its demand: count what is left.
            idle_beside = length - total_busy - max(0.0, covered - thawed[k])
            if (idle and idle_beside >= p.idle_margin * length and thawed[k] >= p.min_thawed_fraction * length
                    and t1 >= h.grace_until):
                # The GPU had time to spare while this holder could run: it used all it wanted.
                h.idle_used += u
                h.idle_thawed += thawed[k]
                if h.idle_thawed >= p.idle_evidence_s:
                    self._proven(h, min(1.0, h.idle_used / h.idle_thawed), t1)
                    h.idle_used = h.idle_thawed = 0.0
            h.history.append((t1, u, length))
            while h.history and h.history[0][0] < t1 - p.report_window_s:
                h.history.popleft()
            h.recent.append((t1, u, thawed[k], beside_frozen[k]))
            while h.recent and h.recent[0][0] < t1 - p.recent_s:
                h.recent.popleft()
        self.measured_until = t1
        self.epoch_span += length
        self.epoch_busy += min(total_busy, length)
        if self.epoch_span >= p.epoch_s:
            self._classify(t1)

    def observe_busy(self, now: float, busy: float) -> None:
        """The GPU's own busy fraction (its latest sample period), polled every slot.

        Idle time while someone was frozen means those left running had no more work. Per-process
        samples floor to integer percents and can hide a few percent of idle between them; the
        GPU-level value floors once. Idle beyond that 1 % is summed with a leak (``idle_memory_s``)
        per holder, only while that holder was thawed through all the sample may cover
        (``busy_span_s``): idle while it was frozen says nothing of its demand. Past
        ``freeze_idle_s`` it proves the demand of that holder, if it ran beside the freezes. The
        same idle is also summed for the GPU as a whole (``waste``, see :attr:`wasting`).
        """
        p = self.params
        last, self._busy_at = self._busy_at, now
        if last is None or now <= last:
            return
        dt = min(now - last, 2 * p.slot_s)
        leak = math.exp(-dt / p.idle_memory_s)
        for h in self.holders.values():
            h.freeze_idle *= leak
        self.waste *= math.exp(-dt / p.waste_memory_s)
        if not any(slot.any_frozen and slot.t1 >= now - p.recent_s for slot in self.log):
            return
        idle = max(0.0, 1.0 - busy - 0.01) * dt
        if idle <= 0:
            return
        self.waste += idle
        span = [slot for slot in self.log if slot.t1 > now - p.busy_span_s and slot.t0 < now]
        freezing = sum(f for _, f in self._recent_freezing)
        for k, h in self.holders.items():
            if not span or not all(k in slot.thawed for slot in span):
                continue
            h.freeze_idle += idle
            if h.freeze_idle < p.freeze_idle_s:
                continue
            h.freeze_idle = 0.0
            used = sum(r[1] for r in h.recent)
            thawed = sum(r[2] for r in h.recent)
            beside = sum(r[3] for r in h.recent)
            if (freezing > 0 and beside >= 0.5 * freezing and thawed > _EPS and now >= h.grace_until
                    and used / thawed < 1 - p.margin):
                self._proven(h, used / thawed, now)

    @property
    def wasting(self) -> bool:
        """Freezes idled the GPU beyond ``waste_share`` on average lately: a fill is overestimated."""
        return self.waste >= self.params.waste_share * self.params.waste_memory_s

    def _proven(self, h: _Holder, rate: float, now: float) -> None:
        """Evidence that ``rate`` is all the holder wants: it sets the target cap and the fill."""
        if rate < 1 - self.params.margin:
            h.limited, h.demand, h.fill, h.confirmed_at = True, rate, rate, now
        else:
            h.limited, h.demand, h.fill = False, 1.0, 1.0

    def _clamp(self, keys: list[K]) -> None:
        overflow = 0.0
        for k in keys:
            h = self.holders[k]
            if h.bucket > h.burst:
                if h.limited:
                    overflow += h.bucket - h.burst
                h.bucket = h.burst
            elif h.bucket < -h.burst:
                h.bucket = -h.burst
        takers = [k for k in keys if not self.holders[k].limited and self.holders[k].bucket < self.holders[k].burst]
        weight = sum(self.holders[k].weight for k in takers)
        for k in takers:
            h = self.holders[k]
            h.bucket = min(h.burst, h.bucket + overflow * h.weight / weight)

    def _classify(self, now: float) -> None:
        p = self.params
        saturated = self.epoch_busy >= (1 - p.idle_margin) * self.epoch_span
        for h in self.holders.values():
            if h.acc_thawed >= p.min_thawed_fraction * self.epoch_span and h.acc_thawed > _EPS:
                rate = h.acc_used / h.acc_thawed
                fair_rate = h.acc_fair / h.acc_thawed
                if rate < fair_rate * (1 - p.margin):
                    self._proven(h, rate, now)  # less than an equal time slice among the contenders
                elif rate > h.fill * (1 + p.margin) + p.headroom:
                    h.limited, h.demand, h.fill = False, 1.0, 1.0  # it used more than we thought it could
                elif h.limited and rate > h.demand * (1 + p.margin) + p.headroom:
                    h.limited, h.demand = False, 1.0
            if h.limited and saturated and h.acc_used < (1 - p.margin) * h.demand * self.epoch_span:
                # Crowded out below its demand on a busy GPU: its target is its entitlement again;
                # its fill (what it was seen to use with room to spare) still guards work conservation.
                h.limited, h.demand = False, 1.0
            if h.fill < 1.0 and now - h.confirmed_at > p.relearn_s:
                # Busy windows cannot tell "wants no more" from "gets no more": test again.
                h.limited, h.demand, h.fill = False, 1.0, 1.0
            h.acc_used = h.acc_thawed = h.acc_fair = 0.0
            h.idle_used = h.idle_thawed = 0.0
        self.epoch_span = self.epoch_busy = 0.0

    @staticmethod
    def _measured(h: _Holder) -> float:
        span = sum(length for _, _, length in h.history)
        return sum(u for _, u, _ in h.history) / span if span > 0 else 0.0

    # --- decision ------------------------------------------------------------------------------
    def _sync(self, now: float, members: Mapping[K, Member]) -> None:
        p = self.params
        for k in [k for k in self.holders if k not in members]:
            del self.holders[k]
        for k, m in members.items():
            h = self.holders.get(k)
            weight = m.weight / 1000.0
            if h is None:
                burst = p.burst_s * weight
                self.holders[k] = _Holder(weight, m.paced, max(1, m.contexts), burst, burst, now + p.grace_s)
            else:
                h.weight, h.paced, h.contexts = weight, m.paced, max(1, m.contexts)
        while self.log and self.log[0].t1 < now - p.log_s:
            self.log.popleft()
        if self.log and self.log[-1].t1 != now:
            self.log[-1].t1 = max(self.log[-1].t0, now)  # the previous slot lasted until this decision

    def _active(self, now: float) -> list[K]:
        window = self.params.active_window_s
        return sorted(
            (
                k
                for k, h in self.holders.items()
                if h.frozen_since is not None or (h.last_active is not None and now - h.last_active <= window)
            ),
            key=repr,
        )

    def _pending(self, k: K) -> float:
        """Predicted bucket change over the slots decided but not yet measured."""
        change = 0.0
        for slot in self.log:
            if slot.t1 <= self.measured_until or not slot.share:
                continue
            span = slot.t1 - max(slot.t0, self.measured_until)
            busy = sum(slot.pred.values())
            change += (slot.share.get(k, 0.0) * busy - slot.pred.get(k, 0.0)) * span
        return change

    def decide(self, now: float, members: Mapping[K, Member]) -> frozenset[K]:
        """The holders to keep frozen during the slot starting at ``now``."""
        p = self.params
        self._sync(now, members)
        active = self._active(now)
        unpaced_busy = any(not self.holders[k].paced for k in active)
        if len(active) <= 1 or unpaced_busy:
            return self._record(now, frozenset(), {})
        caps = {
            k: 1.0 if not h.limited else min(1.0, h.demand * (1 + p.margin) + p.headroom)
            for k in active
            for h in (self.holders[k],)
        }
        targets = waterfill({k: self.holders[k].weight for k in active}, caps)
        total = sum(targets.values()) or 1.0
        share = {k: targets[k] / total for k in active}
        for k in active:
            self.holders[k].target = targets[k]
        credit = {k: self.holders[k].bucket + self._pending(k) for k in active}
        thaw: set[K] = set()
        for k in active:
            h = self.holders[k]
            overdue = h.frozen_since is not None and now - h.frozen_since + p.slot_s > p.max_freeze_s + _EPS
            if now < h.grace_until or credit[k] > 0 or overdue:
                thaw.add(k)
        # The frozen, most credit per weight first (ties in the order of ``active``).
        owed = {k: credit[k] / self.holders[k].weight for k in active if k not in thaw}
        rest = sorted(owed, key=owed.__getitem__, reverse=True)
        # Work conservation: the thawed holders must be able to use the whole GPU between them.
        while rest and sum(self.holders[k].fill for k in thaw) < 1 - _EPS:
            thaw.add(rest.pop(0))
        if rest and self.wasting:  # freezes idled it anyway (a fill overestimated): one more
            thaw.add(rest.pop(0))
            self.backstop_slots += 1
        frozen = frozenset(k for k in active if k not in thaw)
        return self._record(now, frozen, share)

    def _record(self, now: float, frozen: frozenset[K], share: dict[K, float]) -> frozenset[K]:
        p = self.params
        # A frozen holder's queue may drain for longer than a slot: count it as contending throughout.
        frozen_contexts = sum(self.holders[k].contexts for k in frozen)
        for k, h in self.holders.items():
            if k in frozen:
                if h.frozen_since is None:
                    h.frozen_since = now
                h.frozen_total += p.slot_s
            else:
                h.frozen_since = None
        thawed = frozenset(k for k in self.holders if k not in frozen)
        # Contenders: all but the holders known to be idle (never seen counts: the safe side).
        window = p.active_window_s
        running = [
            k
            for k, h in self.holders.items()
            if k not in frozen and (h.last_active is None or now - h.last_active <= window)
        ]
        contexts = {k: float(self.holders[k].contexts) for k in running}
        pred = waterfill(contexts, {k: self.holders[k].fill for k in running})
        self.log.append(
            _Slot(now, now + p.slot_s, thawed, bool(frozen), int(sum(contexts.values())) + frozen_contexts, share, pred)
        )
        self.engaged = bool(share)
        return frozen

    def fail_open(self, now: float, members: Mapping[K, Member]) -> frozenset[K]:
        """Measurements failed: thaw everyone for this slot (compute pacing fails open)."""
        self._sync(now, members)
        return self._record(now, frozenset(), {})

    # --- reporting -----------------------------------------------------------------------------
    def views(self, now: float) -> dict[K, HolderView]:
        """A snapshot per holder: target and measured share, credit, demand estimate, freezing."""
        active = set(self._active(now))
        out: dict[K, HolderView] = {}
        for k, h in self.holders.items():
            measured = self._measured(h)
            out[k] = HolderView(
                weight=h.weight,
                target=h.target if self.engaged and k in active else (h.demand if h.limited else 1.0),
                measured=measured,
                bucket=h.bucket,
                burst=h.burst,
                demand=h.demand,
                limited=h.limited,
                frozen=h.frozen_since is not None,
                frozen_total_s=h.frozen_total,
                in_grace=now < h.grace_until,
                active=k in active,
            )
        return out
