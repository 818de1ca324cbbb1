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
jobs of several cards ``reference_waits`` is no reference at all: first in, first out, a job of 8 cards
at the head of its one line of whole cards holds up every whole card behind it.

For jobs of several cards, ``product_waits`` gives every product its own line: arrival order with a
head start per product, and holds (a head that has waited long enough stops every line behind it);
the same relaxation, the same caveats (its slices are served worse than on the real cluster, so judge
the other products against its own first in, first out). ``alone_waits`` is the one lower bound here,
for every policy that serves each product in arrival order and preempts nothing: each product of
whole cards with every other product removed.

Pure and deterministic; O(n log n) for n jobs: the order only matters when capacity frees or a job
arrives, both events, so a job crossing an age needs no event of its own (nothing new fits then).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence

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

    def line_of(k: int) -> str:
        return WHOLES if requests[k].whole else size_class(requests[k])

    def key(name: str, k: int, now: float) -> tuple[float, int, float]:
        """Where a line whose head is ``k`` comes in the order (ties: whole cards, then the earlier arrival)."""
        arrived = jobs[k].arrival
        if name == WHOLES:
            return (-math.inf if now - arrived >= wholes_after_s else arrived, 0, arrived)
        return (arrived - named.get(name, every), 1, arrived)

    start = _fluid_starts(jobs, requests, cards, line_of, key, lambda k, now: False, first_line=WHOLES)
    return _waits_by_product(jobs, requests, start)


def product_waits(jobs: Sequence[Job], requests: Sequence[Request], cards: int,
                  ahead_s: Mapping[str, float] | None = None, hold_after_s: float = math.inf) -> dict[str, list[float]]:
    """Per reported product, every job's wait in seconds with **every product in its own line**, jobs of
    several cards too (a k-card job takes any k free cards): the heads in arrival order, a product named
    in ``ahead_s`` counted that many seconds earlier (the simulator's ``ahead.KIND``; ∞: always first).
    A head that does not fit blocks its own line; once it has waited ``hold_after_s`` it also blocks every
    line after it in the order (a hold: with fluid cards, holding k cards for it means starting nothing
    else until they are free). ``hold_after_s`` ∞: first in, first out with backfill (best effort's
    order); 0: strict arrival order."""
    if len(jobs) != len(requests):
        raise ValueError(f"{len(jobs)} jobs but {len(requests)} requests")
    ahead = dict(ahead_s or {})
    if any(math.isnan(a) for a in ahead.values()):
        raise ValueError(f"ahead_s must be numbers or ±inf, got {ahead_s}")
    if not hold_after_s >= 0:
        raise ValueError(f"hold_after_s must be at least 0, got {hold_after_s}")

    def line_of(k: int) -> str:
        return size_class(requests[k])

    def key(name: str, k: int, now: float) -> tuple[float, int, float]:
        arrived = jobs[k].arrival
        return (arrived - ahead.get(name, 0.0), 0, arrived)

    def holds(k: int, now: float) -> bool:
        return now - jobs[k].arrival >= hold_after_s

    return _waits_by_product(jobs, requests, _fluid_starts(jobs, requests, cards, line_of, key, holds))


def alone_waits(jobs: Sequence[Job], requests: Sequence[Request], cards: int) -> dict[str, list[float]]:
    """Per product of whole cards, every job's wait in seconds with every other product removed, first in,
    first out. A lower bound, job by job, on its wait under any policy that serves the product in arrival
    order and preempts nothing, on any cluster of ``cards`` cards (node boundaries only forbid): with k
    cards a job and m = ⌊cards / k⌋, a job starts no earlier than the one before it and when at most m - 1
    earlier ones still run; the alone schedule starts each job at the earliest such moment, so by
    induction over arrivals no start can come sooner. The bound ignores what the other products hold, so
    it is far below what any policy reaches; it says how much of a tail the product makes by itself."""
    if len(jobs) != len(requests):
        raise ValueError(f"{len(jobs)} jobs but {len(requests)} requests")
    out: dict[str, list[float]] = {}
    for product in dict.fromkeys(size_class(r) for r in requests if r.whole):
        kept = [k for k, r in enumerate(requests) if r.whole and size_class(r) == product]
        out.update(product_waits([jobs[k] for k in kept], [requests[k] for k in kept], cards))
    return out


def _waits_by_product(jobs: Sequence[Job], requests: Sequence[Request],
                      start: Sequence[float]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for i, j in enumerate(jobs):
        out.setdefault(size_class(requests[i]), []).append(start[i] - j.arrival)
    return out


Key = Callable[[str, int, float], tuple[float, int, float]]  # (line, its head, now) -> where the line comes


def _fluid_starts(jobs: Sequence[Job], requests: Sequence[Request], cards: int, line_of: Callable[[int], str],
                  key: Key, holds: Callable[[int, float], bool], first_line: str | None = None) -> list[float]:
    """Each job's start (∞: never) on ``cards`` fluid cards: every job waits in its line (``line_of``), first
    in, first out; at each arrival and departure the heads are tried in ``key`` order and the first that fits
    starts, again until none does. A head that does not fit blocks its own line, and every line after it
    too when ``holds(head, now)``. O(n log n · lines): the order only matters at events (nothing new fits
    between two), so an age crossed needs no event of its own."""
    events: list[tuple[float, int, int]] = [(j.arrival, 1, i) for i, j in enumerate(jobs)]  # (time, kind, job)
    heapq.heapify(events)
    lines: dict[str, deque[int]] = {} if first_line is None else {first_line: deque()}
    slice_milli = 0
    whole_cards = 0
    start: list[float] = [math.inf] * len(jobs)

    def fits(k: int) -> bool:
        rk = requests[k]
        if rk.whole:
            return whole_cards + rk.count + math.ceil(slice_milli / 1000) <= cards
        return whole_cards + math.ceil((slice_milli + rk.milli) / 1000) <= cards

    def next_start(now: float) -> deque[int] | None:
        ordered = sorted((name for name, line in lines.items() if line), key=lambda n: key(n, lines[n][0], now))
        for name in ordered:
            head = lines[name][0]
            if fits(head):
                return lines[name]
            if holds(head, now):
                return None
        return None

    while events:
        now, kind, i = heapq.heappop(events)
        r = requests[i]
        if kind == 0:  # a departure
            if r.whole:
                whole_cards -= r.count
            else:
                slice_milli -= r.milli
        else:
            lines.setdefault(line_of(i), deque()).append(i)
        while (line := next_start(now)) is not None:  # each pass starts one job
            k = line.popleft()
            if requests[k].whole:
                whole_cards += requests[k].count
            else:
                slice_milli += requests[k].milli
            start[k] = now
            duration = jobs[k].duration
            if duration is not None:
                heapq.heappush(events, (now + duration, 0, k))
    return start
