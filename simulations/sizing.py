"""Sizing: the smallest card count whose wait percentile meets a target, by bisection.

Waits fall as cards are added (not strictly for every seed, but the pooled percentile does in
practice); the search doubles an upper bound until the target is met, then bisects between the
last miss and the first hit. Every evaluated point is kept for the curve.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field


class SizingError(ValueError):
    """A search that cannot run: bad bounds or target, or no card count up to the cap meets it."""


@dataclass
class Sizing:
    """The answer and every (cards, wait) point measured on the way."""

    target_s: float
    cards: int | None  # None: even max_cards misses the target
    points: dict[int, float] = field(default_factory=dict)

    def curve(self) -> list[tuple[int, float]]:
        return sorted(self.points.items())


def smallest_cards(wait_at: Callable[[int], float], target_s: float, low: int, max_cards: int,
                   start: int | None = None, on_point: Callable[[int, int, int | None], None] | None = None) -> Sizing:
    """Smallest n in [low, max_cards] with ``wait_at(n) <= target_s``.

    ``low`` must be a count known to miss or the smallest worth trying (the offered work's lower
    bound); ``start`` is the first upper guess (default 2 × low). ``on_point(n, k, at_most)`` is
    told before the k-th count is measured; ``at_most`` bounds the measurements of the whole search
    once bisection has begun (``k - 1 + ⌈log2(hit - miss)⌉``), None while it still doubles.
    """
    if not (math.isfinite(target_s) and target_s >= 0):
        raise SizingError(f"wait target must be a finite number of seconds >= 0, got {target_s}")
    if low < 1 or max_cards < low:
        raise SizingError(f"need 1 <= low <= max_cards, got {low} and {max_cards}")
    result = Sizing(target_s, None)
    bracket: list[int] = []  # (miss, hit) once bisecting

    def meets(n: int) -> bool:
        if n not in result.points:
            if on_point is not None:
                at_most = len(result.points) + math.ceil(math.log2(bracket[1] - bracket[0])) if bracket else None
                on_point(n, len(result.points) + 1, at_most)
            result.points[n] = wait_at(n)
        value = result.points[n]
        return not math.isnan(value) and value <= target_s

    if meets(low):
        result.cards = low
        return result
    miss = low
    hit = min(max(start or 2 * low, low + 1), max_cards)
    while not meets(hit):
        if hit == max_cards:
            return result
        miss = hit
        hit = min(2 * hit, max_cards)
    while hit - miss > 1:
        bracket[:] = [miss, hit]
        mid = (miss + hit) // 2
        if meets(mid):
            hit = mid
        else:
            miss = mid
    result.cards = hit
    return result


def lower_bound_cards(work_milli_s: float, span_s: float) -> int:
    """Cards below which the offered work cannot even be served on average (ρ >= 1)."""
    if span_s <= 0:
        raise SizingError("the workload's arrivals span no time")
    return max(1, math.ceil(work_milli_s / span_s / 1000))
