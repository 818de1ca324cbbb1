"""The no-fragmentation reference: how long whole-card jobs would wait if slices cost nothing but their size.

Slices (requests of part of a card) are packed fluidly: at any moment they occupy exactly
ceil(their milli / 1000) cards, wherever they are, and they start as soon as that fits (first in,
first out among them, ahead of whole cards). Jobs of whole cards start first in, first out on the
cards left; node boundaries are ignored (k cards anywhere). No placement or admission on the real
cluster does better for whole cards of one card each without delaying slices: this is the lower
reference the fairness table sets a strategy's whole-card tail against on single-card mixes
(``tests/bench/bench_fairness.py``). With ``wholes_first`` whole cards go ahead of slices instead:
what they could wait if slices paid. With jobs of several cards it is no bound: first in, first out,
a job of 8 cards at the head of the line holds up every whole card behind it.

Pure and deterministic; O(n log n) for n jobs.
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
                    wholes_first: bool = False) -> dict[str, list[float]]:
    """Per reported product (``size_class``), every job's wait in seconds under the reference."""
    if len(jobs) != len(requests):
        raise ValueError(f"{len(jobs)} jobs but {len(requests)} requests")
    events: list[tuple[float, int, int]] = [(j.arrival, 1, i) for i, j in enumerate(jobs)]  # (time, kind, job)
    heapq.heapify(events)
    slices: deque[int] = deque()
    wholes: deque[int] = deque()
    slice_milli = 0
    whole_cards = 0
    start: list[float] = [math.inf] * len(jobs)  # never started: an infinite wait

    def used(milli: int, whole: int) -> int:
        return whole + math.ceil(milli / 1000)

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
        for line in ((wholes, slices) if wholes_first else (slices, wholes)):
            while line:
                k = line[0]
                rk = requests[k]
                if rk.whole and used(slice_milli, whole_cards + rk.count) <= cards:
                    whole_cards += rk.count
                elif not rk.whole and used(slice_milli + rk.milli, whole_cards) <= cards:
                    slice_milli += rk.milli
                else:
                    break
                line.popleft()
                start[k] = now
                duration = jobs[k].duration
                if duration is not None:
                    heapq.heappush(events, (now + duration, 0, k))
    out: dict[str, list[float]] = {}
    for i, j in enumerate(jobs):
        out.setdefault(size_class(requests[i]), []).append(start[i] - j.arrival)
    return out
