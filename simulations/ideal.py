"""The no-fragmentation reference: how long each product would wait if slices cost nothing but their size.

A relaxation of the real cluster. Slices (requests of part of a card) are packed fluidly: at any
moment they occupy exactly ceil(their milli / 1000) cards, wherever they are, and start as soon as
that fits. Jobs of whole cards take any k free cards; node boundaries are ignored. Each line (slices;
whole cards) is first in, first out. Who goes first when both could start is one parameter,
``wholes_after_s`` (τ): a whole-card job that has waited τ goes ahead of every slice, a younger one
after them. τ = ∞ (the default): slices first, the lower reference the fairness table sets a
strategy's whole-card tail against without delaying slices; τ = 0: whole cards first, what they
could wait if slices paid; in between, the frontier between the two (``bench_fairness --frontier``).

Why it is optimistic for every product: no card is ever lost to fragmentation (a real placement
wastes the part of a card no waiting slice fits) and nothing waits for a node with room, so, for
the same order of service, no placement on the real cluster starts anyone sooner. What it does NOT
prove: τ spans one family of orders (an aging threshold for whole cards) in this relaxation, not
every admission policy; an order outside the family (by slice size, preemption, reservations of k
cards) may serve the worst product better, so its frontier is an argued reference, not an optimum.
With jobs of several cards it is no bound at all: first in, first out, a job of 8 cards at the head
of the line holds up every whole card behind it.

Pure and deterministic; O(n log n) for n jobs: the order only matters when capacity frees or a job
arrives, both events, so a whole card turning τ old needs no event of its own (nothing new fits then).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Sequence

from packing.products import Request
from simulations.traces import Job
from simulations.workload import size_class


def reference_waits(jobs: Sequence[Job], requests: Sequence[Request], cards: int,
                    wholes_after_s: float = math.inf) -> dict[str, list[float]]:
    """Per reported product (``size_class``), every job's wait in seconds under the reference, whole-card
    jobs going ahead of slices once they have waited ``wholes_after_s`` (0: always; ∞: never)."""
    if len(jobs) != len(requests):
        raise ValueError(f"{len(jobs)} jobs but {len(requests)} requests")
    if not wholes_after_s >= 0:
        raise ValueError(f"wholes_after_s must be at least 0, got {wholes_after_s}")
    events: list[tuple[float, int, int]] = [(j.arrival, 1, i) for i, j in enumerate(jobs)]  # (time, kind, job)
    heapq.heapify(events)
    slices: deque[int] = deque()
    wholes: deque[int] = deque()
    slice_milli = 0
    whole_cards = 0
    start: list[float] = [math.inf] * len(jobs)  # never started: an infinite wait

    def used(milli: int, whole: int) -> int:
        return whole + math.ceil(milli / 1000)

    def serve(line: deque[int], now: float, arrived_by: float) -> None:
        """Start the head of ``line`` while it fits and arrived by ``arrived_by``."""
        nonlocal slice_milli, whole_cards
        while line and jobs[line[0]].arrival <= arrived_by:
            k = line[0]
            rk = requests[k]
            if rk.whole and used(slice_milli, whole_cards + rk.count) <= cards:
                whole_cards += rk.count
            elif not rk.whole and used(slice_milli + rk.milli, whole_cards) <= cards:
                slice_milli += rk.milli
            else:
                return
            line.popleft()
            start[k] = now
            duration = jobs[k].duration
            if duration is not None:
                heapq.heappush(events, (now + duration, 0, k))

    while events:
        now, kind, i = heapq.heappop(events)
        r = requests[i]
        if kind == 0:  # a departure
            if r.whole:
                whole_cards -= r.count
            else:
                slice_milli -= r.milli
        else:
            (wholes if r.whole else slices).append(i)
        serve(wholes, now, now - wholes_after_s)  # those that have waited τ: ahead of every slice
        serve(slices, now, math.inf)
        serve(wholes, now, math.inf)
    out: dict[str, list[float]] = {}
    for i, j in enumerate(jobs):
        out.setdefault(size_class(requests[i]), []).append(start[i] - j.arrival)
    return out
