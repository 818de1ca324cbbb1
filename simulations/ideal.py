"""The no-fragmentation reference: how long each product would wait if slices cost nothing but their size.

A relaxation of the real cluster. Slices (requests of part of a card) are packed fluidly: at any
moment they occupy exactly ceil(their milli / 1000) cards, wherever they are, and start as soon as
that fits. Jobs of whole cards take any k free cards; node boundaries are ignored. Each line (slices;
whole cards) is first in, first out; between the two lines, the head that comes first in the order
below starts if it fits, else the other line's head may (a head that does not fit blocks its own
line only). The order has two parameters, each spanning the corners:

* ``wholes_after_s`` (τ): a whole-card job that has waited τ goes ahead of every slice. τ = 0: whole
  cards first (what they could wait if slices paid); τ = ∞ (the default): as ``slice_head_start_s`` says;
* ``slice_head_start_s`` (h): otherwise both lines are served in arrival order, a slice counted as if
  it had arrived h earlier (earliest due date with a due date per product: on one machine with every
  job present, the order that minimises the largest lateness, Jackson's rule; a heuristic here).
  h = ∞ (the default): slices first, the lower reference the fairness table sets a strategy's
  whole-card tail against without delaying slices; h = 0: first in, first out across products (best
  effort's order); h = -∞: whole cards first.

Why it is a relaxation: at any moment a real cluster's slices touch at least ceil(their milli / 1000)
cards and node boundaries only forbid, so every schedule a real cluster can run (the same start
times) is feasible here; the best schedule here is at least as good as the real cluster's best, for
any objective. What it does NOT prove: this module runs two families of orders (τ, h), not that best
schedule; an order outside them (by runtime, by slice size, reservations of k cards, leaving cards idle) may
serve the worst product better, so their frontier (``bench_fairness --frontier``) is an argued
reference, not a lower bound over all policies. Nor is one order here optimistic for every product:
compaction leaves at most one part-used card, where a real cluster's fragments are room only slices
can use, so under the same order slices can wait longer here (first in, first out here makes
quarters wait longer than best effort does on the real cluster) while whole cards wait less. With
jobs of several cards it is no reference at all: first in, first out, a job of 8 cards at the head of
its line holds up every whole card behind it.

Pure and deterministic; O(n log n) for n jobs: the order only matters when capacity frees or a job
arrives, both events, so a job crossing an age needs no event of its own (nothing new fits then).
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
                    wholes_after_s: float = math.inf,
                    slice_head_start_s: float = math.inf) -> dict[str, list[float]]:
    """Per reported product (``size_class``), every job's wait in seconds under the reference: whole-card
    jobs go ahead of slices once they have waited ``wholes_after_s`` (τ; 0: always, ∞: never), and
    otherwise in arrival order with slices counted ``slice_head_start_s`` earlier (h; ∞: slices first,
    0: first in, first out, -∞: whole cards first)."""
    if len(jobs) != len(requests):
        raise ValueError(f"{len(jobs)} jobs but {len(requests)} requests")
    if not wholes_after_s >= 0:
        raise ValueError(f"wholes_after_s must be at least 0, got {wholes_after_s}")
    if math.isnan(slice_head_start_s):
        raise ValueError("slice_head_start_s must be a number or ±inf, got nan")
    events: list[tuple[float, int, int]] = [(j.arrival, 1, i) for i, j in enumerate(jobs)]  # (time, kind, job)
    heapq.heapify(events)
    slices: deque[int] = deque()
    wholes: deque[int] = deque()
    slice_milli = 0
    whole_cards = 0
    start: list[float] = [math.inf] * len(jobs)  # never started: an infinite wait

    def used(milli: int, whole: int) -> int:
        return whole + math.ceil(milli / 1000)

    def fits(k: int) -> bool:
        rk = requests[k]
        if rk.whole:
            return used(slice_milli, whole_cards + rk.count) <= cards
        return used(slice_milli + rk.milli, whole_cards) <= cards

    def lines(now: float) -> tuple[deque[int], deque[int]]:
        """The two lines, the one whose head goes first before the other (ties: whole cards)."""
        if not slices or not wholes:
            return (slices, wholes) if slices else (wholes, slices)
        arrived = jobs[wholes[0]].arrival
        whole_key = -math.inf if now - arrived >= wholes_after_s else arrived
        slice_key = jobs[slices[0]].arrival - slice_head_start_s
        return (wholes, slices) if whole_key <= slice_key else (slices, wholes)

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
        while True:  # start heads in order until neither fits: each pass starts one job
            line = next((line for line in lines(now) if line and fits(line[0])), None)
            if line is None:
                break
            k = line.popleft()
            if requests[k].whole:
                whole_cards += requests[k].count
            else:
                slice_milli += requests[k].milli
            start[k] = now
            duration = jobs[k].duration
            if duration is not None:
                heapq.heappush(events, (now + duration, 0, k))
    out: dict[str, list[float]] = {}
    for i, j in enumerate(jobs):
        out.setdefault(size_class(requests[i]), []).append(start[i] - j.arrival)
    return out
