"""The cluster's spare GPU capacity lately: how many GPUs' worth stood free, averaged over time.

worst-first lets the front's shape, when it needs several cards, hold at most the GPUs the cluster has
had spare lately (``packing.admission.worst_first``): a hold idles whole cards, and idle cards cost the
other products a wait that grows as the spare room shrinks (protocol B, 64 cards: about 5 GPUs free on
average at ρ 0.95, half the room of 0.85). The capacity is observed after each admission step (free
milli / 1000, summed over the GPUs in service) and stands until the next; the meter keeps its time
mean with weights that fall as exp(-age / window), normalised by the weight seen so far, so that a
young meter reads the mean since its first observation rather than leaning on it:

    mean(t) = (M0 x W0 x f + last x window x (1 - f)) / (W0 x f + window x (1 - f)),   f = exp(-(t - t0) / window)

with M0, W0 the mean and total weight at the last observation t0, ``last`` the capacity observed then.
The meter lives in the strategy object, in memory: a restarted extender, or a new leader, starts it
empty, and until its first step only the share caps the holds.

Invariants (``_check``): the mean lies between the smallest and the largest capacity observed; the
weight is at most ``window``; both are None / 0 before the first observation. ``observe`` and ``mean``
are O(1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from packing.ledger import Ledger


def spare_gpus(ledger: Ledger) -> float:
    """GPUs' worth of free capacity now (free milli / 1000, summed over GPUs in service). O(1): the ledger keeps
    the total."""
    return ledger.free_gpu_milli / 1000.0


@dataclass(slots=True)
class SpareMeter:
    """The time mean of spare capacity over about ``window`` seconds (> 0, finite)."""

    window: float
    _at: float | None = None  # when the last observation was made
    _mean: float = 0.0  # the mean at ``_at``
    _weight: float = 0.0  # the total weight at ``_at`` (seconds, decayed): at most ``window``
    _last: float = 0.0  # the capacity observed at ``_at``, standing since
    _low: float = math.inf  # the smallest and largest observed (``_check``)
    _high: float = -math.inf

    def observe(self, now: float, spare: float) -> None:
        """The spare capacity an admission step left at ``now`` (it stands until the next observation)."""
        if self._at is None:
            self._mean = spare  # with no weight yet: what the first observation reads
        else:
            now = max(now, self._at)  # a step's clock never runs back: the meter's does not either
            self._mean, self._weight = self._at_time(now)
        self._at = now
        self._last = spare
        self._low, self._high = min(self._low, spare), max(self._high, spare)

    def mean(self, now: float) -> float | None:
        """The mean at ``now``; None before anything was observed."""
        if self._at is None:
            return None
        return self._at_time(now)[0]

    def _at_time(self, now: float) -> tuple[float, float]:
        """(mean, weight) at ``now``: the standing observation added for the time since ``_at``."""
        assert self._at is not None
        f = math.exp(-max(0.0, now - self._at) / self.window)
        old, new = self._weight * f, self.window * (1.0 - f)
        if old + new <= 0.0:
            return self._last, 0.0  # observed at this very instant: it is all there is
        return (self._mean * old + self._last * new) / (old + new), old + new

    def _check(self) -> None:
        if self._at is None:
            assert self._weight == 0.0
            return
        assert self._low - 1e-9 <= self._mean <= self._high + 1e-9, (self._mean, self._low, self._high)
        assert 0.0 <= self._weight <= self.window * (1 + 1e-9), (self._weight, self.window)
