"""How long the claims of each product waited: the expected wait a waiting claim is told, and the tails
worst-first's hold clock reads (``packing.admission.worst_first``).

Per product the last ``window`` waits (admission - arrival) of claims the queue admitted, sorted as
well as in arrival order. A waiting claim that has waited ``w`` so far is told the median of the
remaining waits of the recorded claims that waited longer than ``w`` (a conditional estimate, like
``RuntimeHistory.ends_within``: the longer it has waited, the more the long waits count), beside the
product's median and p90; with fewer than ``min_seen`` waits recorded for its product, nothing. A
claim admitted again (its reservation lapsed, its bind failed) counts again.

Invariants (``verify``): per product, the sorted index holds exactly the waits of the recent deque,
at most ``window`` of them. Cost: ``add`` and ``quantile`` O(log window); ``lately`` O(window) (once per
product per explain pass), and then ``WaitLately.remaining`` O(log window) per claim.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass

from sortedcontainers import SortedList

from packing.entitlements import product_name
from packing.products import Request

DEFAULT_WINDOW = 500  # recent admissions per product: a few hours of a busy product, so it follows the load
MIN_SEEN = 20  # fewer waits than this say nothing about a product


@dataclass(frozen=True, slots=True)
class WaitSummary:
    """One product's recent waits in three figures (what a pod's condition and /state show)."""

    kind: str  # the product (and xN for N whole cards)
    median: float
    p90: float
    seen: int  # admitted claims the figures come from


@dataclass(frozen=True, slots=True)
class WaitLately:
    """A snapshot of one product's recent waits: what a waiting claim of it is told."""

    summary: WaitSummary
    waits: tuple[float, ...]  # sorted

    def remaining(self, waited: float) -> float | None:
        """The median further wait of the recorded claims that waited longer than ``waited``; None when
        none did (a conditional estimate: the longer a claim has waited, the more the long waits count)."""
        first = bisect.bisect_right(self.waits, waited)
        longer = len(self.waits) - first
        if not longer:
            return None
        return self.waits[first + (longer - 1) // 2] - max(0.0, waited)


def kind_of(request: Request) -> str:
    """What waits are kept under: the product, and ``xN`` for a request of N whole cards (they wait longer)."""
    name = product_name(request)
    return name if request.count <= 1 else f"{name}x{request.count}"


class WaitHistory:
    """The recent waits of the admitted claims, per product."""

    def __init__(self, window: int = DEFAULT_WINDOW, min_seen: int = MIN_SEEN) -> None:
        if window < 1 or min_seen < 1:
            raise ValueError("a wait history needs a window and a minimum of at least one")
        self.window = window
        self.min_seen = min_seen
        self._sorted: dict[str, SortedList] = {}
        self._recent: dict[str, deque[float]] = {}

    def add(self, product: str, wait: float) -> None:
        """A claim of ``product`` was admitted after waiting ``wait`` seconds."""
        wait = max(0.0, float(wait))
        ordered = self._sorted.get(product)
        if ordered is None:
            ordered = self._sorted[product] = SortedList()
            self._recent[product] = deque()
        recent = self._recent[product]
        ordered.add(wait)
        recent.append(wait)
        if len(recent) > self.window:
            ordered.remove(recent.popleft())

    def seen(self, product: str) -> int:
        return len(self._recent.get(product, ()))

    def products(self) -> list[str]:
        return sorted(p for p in self._recent if self.seen(p) >= self.min_seen)

    def quantile(self, product: str, q: float) -> float | None:
        """The ``q`` quantile (0..1, nearest rank) of the product's recorded waits; None below ``min_seen``."""
        ordered = self._sorted.get(product)
        if ordered is None or len(ordered) < self.min_seen:
            return None
        k = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
        return float(ordered[k])

    def lately(self, product: str) -> WaitLately | None:
        """A snapshot of the product's recent waits; None below ``min_seen``."""
        ordered = self._sorted.get(product)
        median, p90 = self.quantile(product, 0.5), self.quantile(product, 0.9)
        if ordered is None or median is None or p90 is None:
            return None
        return WaitLately(WaitSummary(product, median, p90, len(ordered)), tuple(ordered))

    def verify(self) -> None:
        for product, recent in self._recent.items():
            assert len(recent) <= self.window, f"{product}: window overrun"
            assert list(self._sorted[product]) == sorted(recent), f"{product}: sorted index drifted"
