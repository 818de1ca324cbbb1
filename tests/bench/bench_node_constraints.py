"""Benchmark of the queue under node constraints (``python -m tests.bench.run node_constraints``).

A full cluster of 10 000 V100 cards (2 500 nodes x 4, labelled pool=a / pool=b) and 10 000 waiting
claims (quarters, halves, whole cards), under the default strategy. Three workloads, measured side
by side in this run:

* ``none``: no claim has node constraints (the simulator's case);
* ``defaults``: every claim carries the two tolerations the API server gives every pod (the
  extender's case for pods that say nothing);
* ``pinned``: half the claims pinned to pool a, a quarter to pool b by required node affinity,
  and 25 nodes cordoned, so every placement, drain target and position goes by node sets.

Figures: one ``admit`` where nothing fits (the common step between events), one departure then
``admit`` (an event), one ``explain`` of every waiting claim, with the garbage collector paused;
each as a ratio to ``none``, which
runs first and last (their spread is the run's noise). ``pinned`` has three times the request
shapes (product x node set), so drain-soonest picks more drain targets per event (a GPU scan each).
Nothing is asserted: shared machines are noisy.
"""

from __future__ import annotations

import gc
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import replace

from packing.ledger import Ledger
from packing.node_fit import NO_EXECUTE, NodeConstraints, Requirement, Term, Toleration
from packing.products import Request, load_catalog
from packing.queue import ClaimQueue, WaitingClaim

V100 = "Tesla-V100-SXM2-32GB"
NODES = 2500
CARDS = 4
WAITING = 10_000
CATALOG = load_catalog()
SHAPES = [CATALOG.request(p) for p in ("v100-25", "v100-50", "v100-100")]
DEFAULTS = NodeConstraints(tolerations=(Toleration("node.kubernetes.io/not-ready", "Exists", "", NO_EXECUTE),
                                        Toleration("node.kubernetes.io/unreachable", "Exists", "", NO_EXECUTE)))
ON_A = replace(DEFAULTS, node_selector=(("pool", "a"),))
ON_B = replace(DEFAULTS, affinity=(Term((Requirement("pool", "In", ("b",)),)),))


def constraints_for(workload: str, i: int) -> NodeConstraints | None:
    if workload == "none":
        return None
    if workload == "defaults":
        return DEFAULTS
    return (ON_A, ON_A, ON_B, DEFAULTS)[i % 4]


def build(workload: str) -> tuple[ClaimQueue, list[str]]:
    rng = random.Random(7)
    ledger = Ledger()
    q = ClaimQueue(ledger)
    quarters: list[str] = []
    for n in range(NODES):
        ledger.add_node(f"n{n}", [(f"n{n}-g{i}", V100, 32768) for i in range(CARDS)], labels={"pool": "ab"[n % 2]},
                        unschedulable=workload == "pinned" and n % 100 == 0)
    for n in range(NODES):
        for i in range(CARDS):
            shape = rng.choice(SHAPES)
            for k in range(1000 // shape.milli):
                name = f"run-{n}-{i}-{k}"
                ledger.assign(name, shape, f"n{n}", (f"n{n}-g{i}",))
                q.start(name, "filler", shape, 0.0)
                if shape.milli == 250:
                    quarters.append(name)
    for i in range(WAITING):
        request: Request = replace(rng.choice(SHAPES), constraints=constraints_for(workload, i))
        q.arrive(WaitingClaim(f"w{i}", f"ns{i % 40}", request, arrived_at=1.0 + i * 1e-3))
    q.admit(10.0)
    return q, quarters


def timed(fn: Callable[[], object], repeat: int) -> float:
    """Median seconds of ``fn``, the garbage collector paused (its full passes over this heap are
    larger than the step itself and land on whichever workload runs when they fall due)."""
    samples = []
    gc.collect()
    gc.disable()
    try:
        for _ in range(repeat):
            started = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - started)
    finally:
        gc.enable()
    return statistics.median(samples)


def measure(workload: str) -> dict[str, float]:
    q, quarters = build(workload)
    now = [20.0]

    def event() -> None:
        now[0] += 1.0
        q.depart(quarters.pop(), now[0])
        q.admit(now[0])

    return {
        "step_ms": timed(lambda: q.admit(now[0]), 21) * 1000,
        "event_ms": timed(event, 9) * 1000,
        "explain_ms": timed(lambda: q.explain(now[0]), 3) * 1000,
    }


def main() -> None:
    # 'none' runs first and last: the spread between the two shows this run's noise
    results = [(w, measure(w)) for w in ("none", "defaults", "pinned", "none")]
    base = {k: statistics.mean(r[k] for w, r in results if w == "none") for k in results[0][1]}
    print(f"{NODES * CARDS} cards, {WAITING} waiting, drain-soonest; median ms (ratio to the mean of 'none')")
    print(f"{'workload':<10} {'step, nothing fits':>22} {'event':>18} {'explain':>18}")
    for w, r in results:
        cells = [f"{r[k]:8.1f} ({r[k] / base[k]:4.2f}x)" for k in ("step_ms", "event_ms", "explain_ms")]
        print(f"{w:<10} {cells[0]:>22} {cells[1]:>18} {cells[2]:>18}")


if __name__ == "__main__":
    main()
