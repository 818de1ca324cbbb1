"""Benchmark of the queue gate's step inside the extender (``python -m tests.bench.run cluster``).

A full cluster (1 000 nodes x 4 V100 cards, every card held) and n gated pods waiting. The gate's
step runs under the extender's state lock, so while it runs no filter or bind is answered; its
cost is what a burst of pod events adds to kube-scheduler's latency. Figures, measured in this run:

* ``admit``: ``ClusterState.admit`` in a settled queue (nothing fits): the baseline;
* ``admit+explain``: the gate step when it also explains the line (at most once a tick: the
  explanation feeds the Pending conditions), and its ratio to the baseline;
* ``due``: the reporter deciding, for every waiting pod, whether its condition or Event is due
  (outside the lock), per step;
* ``observe_bound``: the sync taking one bound pod's record into the ledger (restart rebuild cost
  per pod), against ``ExtenderState.adopt``'s plain path measured the same way.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from functools import partial

from extender.cluster.pending_writer import PendingNotifier, notice_of
from extender.cluster.state import ClusterState
from extender.inventory import synthetic_cards
from extender.state import StateConfig
from packing.asks import PodAsk
from packing.products import load_catalog
from packing.queue import Explanation
from packing.record import AllocationRecord

CATALOG = load_catalog()
V100 = "Tesla-V100-SXM2-32GB"
NODES = 1000
CARDS = 4
SIZES = (1_000, 10_000)


class NoBinder:
    def bind(self, args: object, record: object) -> None:
        pass

    def release(self, pod_uid: str) -> None:
        pass


def full(waiting: int) -> ClusterState:
    """Every card held by one whole-card pod; ``waiting`` gated pods in line."""
    state = ClusterState(CATALOG, NoBinder(), StateConfig(reservation_ttl_s=30), clock=lambda: 1e6)
    whole = CATALOG.request("v100-100")
    for n in range(NODES):
        node = f"n{n}"
        state.sync_node(node, synthetic_cards(node, CARDS, V100, 32768))
        for g in range(CARDS):
            uid = f"run-{n}-{g}"
            rec = AllocationRecord(uid, node, (f"{node}/gpu-{g}",), "v100-100", 1000, 32768)
            state.observe_bound(PodAsk(uid, uid, "ns", whole), rec, node)
    products = ("v100-25", "v100-50", "v100-100")
    for i in range(waiting):
        request = CATALOG.request(products[i % 3])
        state.gate_arrive(PodAsk(f"w-{i}", f"w-{i}", f"ns-{i % 20}", request), 1000.0 + i, "gated")
    return state


def per_call(fn: Callable[[], object], repeat: int) -> float:
    """Median seconds of one call over ``repeat`` calls."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def gate_step(state: ClusterState) -> None:
    state.admit(1e6)
    state.explain(1e6)


def decide(explanations: list[Explanation], notifier: PendingNotifier) -> None:
    for e in explanations:
        notifier.due(e.claim, notice_of(e), 5.0)


def main() -> None:
    print(f"{NODES} nodes x {CARDS} cards, all held; n gated pods waiting")
    print(f"{'n':>7} {'admit':>10} {'admit+explain':>14} {'ratio':>6} {'due (all)':>10}")
    for n in SIZES:
        state = full(n)
        admit = per_call(partial(state.admit, 1e6), 21)
        step = per_call(partial(gate_step, state), 7)
        notifier = PendingNotifier(10.0)
        explanations = state.explain(1e6)
        for e in explanations:
            notifier.written(e.claim, notice_of(e), 0.0)
        due = per_call(partial(decide, explanations, notifier), 7)
        print(f"{n:>7} {admit * 1e3:>8.2f}ms {step * 1e3:>12.2f}ms {step / admit:>5.0f}x {due * 1e3:>8.2f}ms")
    whole = CATALOG.request("v100-100")
    state = ClusterState(CATALOG, NoBinder(), StateConfig(), clock=lambda: 1e6)
    for n in range(NODES):
        state.sync_node(f"n{n}", synthetic_cards(f"n{n}", CARDS, V100, 32768))
    uids = [(f"p{n}-{g}", f"n{n}", g) for n in range(NODES) for g in range(CARDS)]
    started = time.perf_counter()
    for uid, node, g in uids:
        state.observe_bound(PodAsk(uid, uid, "ns", whole),
                            AllocationRecord(uid, node, (f"{node}/gpu-{g}",), "v100-100", 1000, 32768), node)
    observe = (time.perf_counter() - started) / len(uids)
    plain = ClusterState(CATALOG, NoBinder(), StateConfig(), clock=lambda: 1e6)
    for n in range(NODES):
        plain.sync_node(f"n{n}", synthetic_cards(f"n{n}", CARDS, V100, 32768))
    started = time.perf_counter()
    for uid, node, g in uids:
        plain.core.adopt(PodAsk(uid, uid, "ns", whole),
                    AllocationRecord(uid, node, (f"{node}/gpu-{g}",), "v100-100", 1000, 32768))
    adopt = (time.perf_counter() - started) / len(uids)
    print(f"rebuild, per bound pod: observe_bound {observe * 1e6:.0f} us, adopt {adopt * 1e6:.0f} us "
          f"(ratio {observe / adopt:.2f}); {len(uids)} pods in {observe * len(uids):.2f} s")
