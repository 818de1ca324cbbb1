"""Benchmark of the claim queue's admission step (``python -m tests.bench.run queue``).

A full cluster of 10 000 V100 cards (2 500 nodes x 4) and n waiting claims (quarters, halves and
whole cards over 40 namespaces, two priorities, some namespaces capped by an entitlement). Figures,
all measured in this run:

* ``step, nothing fits``: one ``admit`` in a settled queue, where no waiting claim fits (the common
  case between events);
* ``event``: one departure of a running quarter, then ``admit`` (which starts the next quarter);
* ``arrive``: one arrival;
* the same step done naively (re-sort every waiting claim, then try them in order, remembering
  the shapes that did not fit), as the baseline the queue's indexes are measured against;
* ``explain``: one ``explain(now)`` of every waiting claim, in ms and per claim, also with the
  garbage collector paused (at 100 000 waiting the 100 000 new Explanations set off a full
  collection, which scans the whole heap: the ledger and the queue, not just the new objects);
* the growth of each figure from 1 000 to 100 000 waiting claims (goal: near-flat, i.e. about
  logarithmic per event, no full re-sort per event; explain: linear, so flat per claim).

Every admission strategy runs (``packing.admission``); drain-soonest with every claim starving
holds up to 64 GPUs, lifted and held again at every step, and scans the GPUs for each new head;
worst-first (the default) the same, holding only its front's shape and lifting the steering targets
for a claim that fits only there.
"""

from __future__ import annotations

import gc
import random
import statistics
import time
from collections.abc import Callable

from packing.entitlements import Entitlement
from packing.ledger import Ledger
from packing.policies import BEST_FIT
from packing.products import Request, load_catalog
from packing.queue import (
    AGING_GUARD,
    BEST_EFFORT_FIFO,
    DRAIN_SOONEST,
    STRICT_FIFO,
    WORST_FIRST,
    ClaimQueue,
    WaitingClaim,
)

V100 = "Tesla-V100-SXM2-32GB"
NODES = 2500
CARDS_PER_NODE = 4
NAMESPACES = 40
SIZES = (1_000, 10_000, 100_000)
CATALOG = load_catalog()
Q = CATALOG.request("v100-25")
H = CATALOG.request("v100-50")
W = CATALOG.request("v100-100")


def full_cluster(admission: str, declared: bool) -> tuple[ClaimQueue, list[str]]:
    """10 000 cards, each held by 4 quarters, 2 halves or 1 whole card; returns the quarters' names.
    ``declared``: every running claim declares a time limit (1 to 10 h), so a head's estimated start
    is known and computed at every step."""
    rng = random.Random(7)
    ledger = Ledger()
    q = ClaimQueue(ledger, BEST_FIT, admission, default_age_limit=2000.0)
    quarters: list[str] = []
    for n in range(NODES):
        gpus = [(f"n{n}-g{i}", V100, 32768) for i in range(CARDS_PER_NODE)]
        ledger.add_node(f"n{n}", gpus)
        for uuid, _, _ in gpus:
            shape = rng.choice((Q, H, W))
            for k in range(1000 // shape.milli):
                name = f"run-{uuid}-{k}"
                ledger.assign(name, shape, f"n{n}", (uuid,))
                limit = rng.uniform(3600.0, 36_000.0) if declared else None
                q.start(name, f"ns{rng.randrange(NAMESPACES)}", shape, now=0.0, time_limit=limit)
                if shape is Q:
                    quarters.append(name)
    for i in range(0, NAMESPACES, 8):  # a few capped namespaces: classes skipped for their entitlement
        q.set_entitlement(f"ns{i}", Entitlement({"v100-25": 0}))
    return q, quarters


def waiting_claims(n: int, seed: int = 11) -> list[WaitingClaim]:
    rng = random.Random(seed)
    shapes: tuple[Request, ...] = (Q, Q, H, W)
    return [
        WaitingClaim(f"w{i}", f"ns{rng.randrange(NAMESPACES)}", rng.choice(shapes), arrived_at=float(i) / 1000,
                     priority=rng.choice((0, 0, 0, 1)), time_limit=rng.choice((None, None, 300.0, 3600.0)))
        for i in range(n)
    ]


def timed(fn: Callable[[], object], repeat: int) -> float:
    """Median seconds of ``repeat`` calls."""
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def naive_step(q: ClaimQueue, now: float) -> int:
    """Baseline: re-sort every waiting claim, try each in order (memo of shapes that did not fit;
    strict FIFO, and the aging guard at a starving claim, stop at the first that does not fit).
    Entitlements and backfill are left out: they only make the baseline slower."""
    ordered = sorted(q.in_order(), key=lambda c: (-c.priority, c.arrived_at, c.claim))
    misfit: set[Request] = set()
    tried = 0
    for c in ordered:
        if c.request in misfit:
            continue
        tried += 1
        if BEST_FIT.choose(q.ledger, c.request) is None:
            if q.admission == STRICT_FIFO or (q.admission == AGING_GUARD and q.starving(c, now)):
                break
            misfit.add(c.request)
    return tried


def measure(n: int, admission: str, now: float, declared: bool) -> dict[str, float]:
    q, quarters = full_cluster(admission, declared)
    claims = waiting_claims(n)
    started = time.perf_counter()
    for c in claims:
        q.arrive(c)
    arrive = (time.perf_counter() - started) / n
    q.admit(now)  # settle: nothing fits in a full cluster
    quiet = timed(lambda: q.admit(now), repeat=30)
    rng = random.Random(3)
    events: list[float] = []
    admitted = backfilled = 0
    for _ in range(200):
        victim = quarters.pop(rng.randrange(len(quarters)))
        t0 = time.perf_counter()
        q.depart(victim, now)
        got = q.admit(now)
        events.append(time.perf_counter() - t0)
        admitted += len(got)
        backfilled += sum(a.backfill for a in got)
        quarters.extend(a.claim for a in got if a.allocation.request == Q)
    naive = timed(lambda: naive_step(q, now), repeat=3 if n >= 100_000 else 10)
    waiting = q.waiting()
    explain = timed(lambda: q.explain(now), repeat=3 if n >= 100_000 else 7)
    gc.disable()
    try:
        explain_no_gc = timed(lambda: q.explain(now), repeat=3 if n >= 100_000 else 7)
    finally:
        gc.enable()
    return {"arrive": arrive, "quiet": quiet, "event": statistics.median(events), "naive": naive,
            "explain": explain, "explain_claim": explain / waiting, "explain_no_gc": explain_no_gc,
            "admitted": admitted, "backfilled": backfilled, "classes": q.classes()}


def main() -> None:
    print(f"cluster: {NODES * CARDS_PER_NODE} cards on {NODES} nodes, full; {NAMESPACES} namespaces, "
          "2 priorities, 3 products; times are medians")
    runs = [(BEST_EFFORT_FIFO, 10.0, False, ""), (AGING_GUARD, 10.0, False, ", no claim past its limit"),
            (AGING_GUARD, 3000.0, False, ", every claim past its limit (T=2000 s): a guard head, no declared ends"),
            (AGING_GUARD, 3000.0, True, ", every claim past its limit, every running claim declares an end: "
             "estimated start and backfill at every step"),
            (DRAIN_SOONEST, 10.0, False, ", no claim past its limit"),
            (DRAIN_SOONEST, 3000.0, False, ", every claim past its limit: up to 64 heads, each holding a GPU"),
            (DRAIN_SOONEST, 3000.0, True, ", every claim past its limit, declared ends: drains and backfill"),
            (WORST_FIRST, 10.0, False, ", no claim past its limit (T=2000 s given)"),
            (WORST_FIRST, 3000.0, False, ", every claim past its limit: up to 64 GPUs of targets, the front's held, "
             "the rest steering"),
            (WORST_FIRST, 3000.0, True, ", every claim past its limit, declared ends: drains and backfill"),
            (STRICT_FIFO, 10.0, False, "")]
    for admission, now, declared, note in runs:
        rows = {n: measure(n, admission, now, declared) for n in SIZES}
        print(f"\nadmission {admission}{note}")
        print(f"{'waiting':>8} {'classes':>7} {'arrive us':>9} {'step (nothing fits) us':>22} "
              f"{'event (depart+admit) us':>23} {'naive step us':>13} {'naive/step':>10} {'explain ms':>10} "
              f"{'explain us/claim':>16} {'explain ms, gc off':>18}")
        for n, r in rows.items():
            print(f"{n:>8} {r['classes']:>7} {r['arrive'] * 1e6:>9.1f} {r['quiet'] * 1e6:>22.1f} "
                  f"{r['event'] * 1e6:>23.1f} {r['naive'] * 1e6:>13.0f} {r['naive'] / r['quiet']:>10.0f} "
                  f"{r['explain'] * 1e3:>10.1f} {r['explain_claim'] * 1e6:>16.2f} {r['explain_no_gc'] * 1e3:>18.1f}")
        lo, hi = rows[SIZES[0]], rows[SIZES[-1]]
        growth = SIZES[-1] // SIZES[0]
        print(f"growth x{growth} waiting: step x{hi['quiet'] / lo['quiet']:.2f}, "
              f"event x{hi['event'] / lo['event']:.2f}, arrive x{hi['arrive'] / lo['arrive']:.2f}, "
              f"naive step x{hi['naive'] / lo['naive']:.1f}, "
              f"explain x{hi['explain'] / lo['explain']:.1f} "
              f"(gc off x{hi['explain_no_gc'] / lo['explain_no_gc']:.1f}); "
              f"admissions in 200 events at 10k: "
              f"{rows[10_000]['admitted']:.0f} ({rows[10_000]['backfilled']:.0f} backfilled)")


if __name__ == "__main__":
    main()
