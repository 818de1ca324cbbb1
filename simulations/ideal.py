"""The no-fragmentation reference: how long each product would wait if slices cost nothing but their size.

A relaxation of the real cluster. Slices (requests of part of a card) are packed fluidly: at any
moment they occupy exactly ceil(their milli / 1000) cards, wherever they are, and start as soon as
that fits. Jobs of whole cards take any k free cards; node boundaries are ignored. Whole-card jobs
wait in one line, each slice product in its own, each line first in, first out; between the lines,
the heads are tried in the order below and the first that fits starts (a head that does not fit
blocks its own line only). The order has two parameters, each spanning the corners:

* ``wholes_after_s`` (τ): a whole-card job that has waited τ goes ahead of every slice. τ = 0: whole
  cards first (what they could wait if slices paid); τ = ∞ (the default): as ``slice_head_start_s`` says;
* ``slice_head_start_s`` (h): otherwise the lines are served in arrival order, a slice counted as if
  it had arrived h earlier, one h for every slice product or one per product (earliest due date with
  a due date per product: on one machine with every job present, the order that minimises the
  largest lateness, Jackson's rule; a heuristic here). h = ∞ (the default): slices first, the lower
  reference the fairness table sets a strategy's whole-card tail against without delaying slices;
  h = 0: first in, first out across products (best effort's order); h = -∞: whole cards first.

Why it is a relaxation: at any moment a real cluster's slices touch at least ceil(their milli / 1000)
cards and node boundaries only forbid, so every schedule a real cluster can run (the same start
times) is feasible here; the best schedule here is at least as good as the real cluster's best, for
any objective. What it does NOT prove: this module runs families of orders (τ, h), not that best
schedule; an order outside them (by runtime, reservations of k cards, leaving cards idle) may serve
the worst product better, so their frontier (``bench_fairness --frontier``) is an argued
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
from collections.abc import Mapping, Sequence

from packing.products import Request
from simulations.traces import Job
from simulations.workload import size_class

WHOLES = ""  # the whole-card line's name among the lines (no product is named so)


def reference_waits(jobs: Sequence[Job], requests: Sequence[Request], cards: int,
                    wholes_after_s: float = math.inf,
                    slice_head_start_s: float | Mapping[str, float] = math.inf) -> dict[str, list[float]]:
    """Per reported product (``size_class``), every job's wait in seconds under the reference: whole-card
    jobs go ahead of slices once they have waited ``wholes_after_s`` (τ; 0: always, ∞: never), and
    otherwise in arrival order with slices counted ``slice_head_start_s`` earlier (h; ∞: slices first,
    0: first in, first out, -∞: whole cards first), one figure for every slice product or one per
    product (``{"v100-25": 3600}``; a slice product not named: 0)."""
    if len(jobs) != len(requests):
        raise ValueError(f"{len(jobs)} jobs but {len(requests)} requests")
    if not wholes_after_s >= 0:
        raise ValueError(f"wholes_after_s must be at least 0, got {wholes_after_s}")
    if isinstance(slice_head_start_s, Mapping):
        named, every = dict(slice_head_start_s), 0.0
    else:
        named, every = {}, float(slice_head_start_s)
    if any(math.isnan(h) for h in (every, *named.values())):
        raise ValueError(f"slice_head_start_s must be numbers or ±inf, got {slice_head_start_s}")
    events: list[tuple[float, int, int]] = [(j.arrival, 1, i) for i, j in enumerate(jobs)]  # (time, kind, job)
    heapq.heapify(events)
    lines: dict[str, deque[int]] = {WHOLES: deque()}  # whole cards in one line; slices one per product
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

    def key(name: str, now: float) -> tuple[float, int, float]:
        """Where a line's head comes in the order (ties: whole cards, then the earlier arrival)."""
        arrived = jobs[lines[name][0]].arrival
        if name == WHOLES:
            return (-math.inf if now - arrived >= wholes_after_s else arrived, 0, arrived)
        return (arrived - named.get(name, every), 1, arrived)

    while events:
        now, kind, i = heapq.heappop(events)
        r = requests[i]
        if kind == 0:  # a departure
            if r.whole:
                whole_cards -= r.count
            else:
                slice_milli -= r.milli
        else:
            lines.setdefault(WHOLES if r.whole else size_class(r), deque()).append(i)
        while True:  # start heads in order until none fits: each pass starts one job
            ordered = sorted((name for name, line in lines.items() if line), key=lambda name: key(name, now))
            line = next((lines[name] for name in ordered if fits(lines[name][0])), None)
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
