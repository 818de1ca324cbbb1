"""Benchmark: best-fit placement through the sorted index against a naive scan of every GPU.

Both run in the same process on the same partly filled clusters (100, 1 000 and 10 000 nodes of
8 V100s, about 60 % allocated, a mix of the three products), so the ratios are measured side by
side. The goal for the indexed path is a per-decision time at 10 000 nodes within 2x of the time
at 100 nodes (logarithmic); the naive scan grows linearly.

Then every registered policy on the same 1 000-node cluster: one node key (what the extender's
fit cache pays per changed node and per snapshot of the mix) and one full decision by scanning
every node's key (``Policy.choose``; best fit takes its index).

Run: ``python -m tests.bench.bench_packing`` (or ``make bench``).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from packing.fragment import TypicalMix
from packing.ledger import Ledger, Node
from packing.mix_estimator import FixedMix
from packing.policies import BEST_FIT, POLICIES, Policy, place, policy_for
from packing.products import Request, load_catalog

SIZES = (100, 1_000, 10_000)
GPUS_PER_NODE = 8
MODEL = "Tesla-V100-SXM2-32GB"
# used milli per card and its probability: 0.15*0 + 0.1*250 + 0.2*500 + 0.25*750 + 0.3*1000 = 61 % full
FILL = ((0, 0.15), (250, 0.10), (500, 0.20), (750, 0.25), (1000, 0.30))
MIX = ("v100-25", "v100-25", "v100-50", "v100-25", "v100-100", "v100-50")
INDEXED_OPS = 3000
NAIVE_BUDGET_GPUS = 2_000_000  # naive ops per size = budget / GPUs: about equal time at every size
REPEATS = 3


def empty_cluster(nodes: int) -> Ledger:
    """A fresh cluster: every node ties with every other, the worst case for walking ties."""
    ledger = Ledger()
    for n in range(nodes):
        ledger.add_node(f"node-{n:05d}", [(f"GPU-{n:05d}-{i}", MODEL, 32768) for i in range(GPUS_PER_NODE)])
    return ledger


@dataclass(frozen=True)
class Row:
    nodes: int
    fill: float
    indexed_us: float  # per place + release
    decide_us: float  # per BEST_FIT.choose
    naive_us: float  # per naive choose + assign + release
    naive_decide_us: float
    fresh_decide_us: float  # per BEST_FIT.choose on an empty cluster
    fresh_naive_us: float


def build(nodes: int, seed: int = 7) -> Ledger:
    """A cluster of ``nodes`` x 8 V100s, each card filled at random per FILL with real claims."""
    catalog = load_catalog()
    quarter, half, whole = (catalog.request(p) for p in ("v100-25", "v100-50", "v100-100"))
    pieces = {0: [], 250: [quarter], 500: [half], 750: [half, quarter], 1000: [whole]}
    rng = random.Random(seed)
    used = [amount for amount, _ in FILL]
    weights = [weight for _, weight in FILL]
    ledger = Ledger()
    claim = 0
    for n in range(nodes):
        name = f"node-{n:05d}"
        ledger.add_node(name, [(f"GPU-{n:05d}-{i}", MODEL, 32768) for i in range(GPUS_PER_NODE)])
        for i, amount in enumerate(rng.choices(used, weights, k=GPUS_PER_NODE)):
            for request in pieces[amount]:
                ledger.assign(f"fill-{claim}", request, name, (f"GPU-{n:05d}-{i}",))
                claim += 1
    return ledger


def naive_choose(ledger: Ledger, request: Request) -> tuple[str, tuple[str, ...]] | None:
    """Best fit by scanning every node and GPU: the baseline the index replaces."""
    best: tuple[tuple[int, int, int], Node, tuple[str, ...]] | None = None
    for node in ledger.nodes.values():
        node_free = node.free_gpu_milli
        if request.whole:
            empty = [g for g in node.gpus if g.empty and request.accepts_model(g.model)]
            if len(empty) >= request.count:
                key = (len(empty), node_free, node.order)
                if best is None or key < best[0]:
                    best = (key, node, tuple(g.uuid for g in empty[: request.count]))
            continue
        for g in node.gpus:
            if g.free_milli >= request.milli and g.free_mib >= request.memory_mib and request.accepts_model(g.model):
                key = (g.free_milli - request.milli, node_free, node.order)
                if best is None or key < best[0]:
                    best = (key, node, (g.uuid,))
    return None if best is None else (best[1].name, best[2])


def timed(ops: int, op: Callable[[int], None]) -> float:
    """Best of REPEATS runs of ``ops`` calls, in microseconds per call."""
    runs = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        for i in range(ops):
            op(i)
        runs.append((time.perf_counter() - start) / ops * 1e6)
    return min(runs)


def measure(nodes: int) -> Row:
    ledger = build(nodes)
    catalog = load_catalog()
    mix: Sequence[Request] = [catalog.request(name) for name in MIX]
    for request in mix:  # the baseline must decide exactly what the index decides
        choice = BEST_FIT.choose(ledger, request)
        assert choice is not None and naive_choose(ledger, request) == (choice.node, choice.gpus), request

    def indexed(i: int) -> None:
        place(ledger, "bench", mix[i % len(mix)], BEST_FIT)
        ledger.release("bench")

    def decide(i: int) -> None:
        BEST_FIT.choose(ledger, mix[i % len(mix)])

    def naive(i: int) -> None:
        request = mix[i % len(mix)]
        found = naive_choose(ledger, request)
        assert found is not None
        ledger.assign("bench", request, found[0], found[1])
        ledger.release("bench")

    def naive_decide(i: int) -> None:
        naive_choose(ledger, mix[i % len(mix)])

    fresh = empty_cluster(nodes)

    def fresh_decide(i: int) -> None:
        BEST_FIT.choose(fresh, mix[i % len(mix)])

    def fresh_naive(i: int) -> None:
        naive_choose(fresh, mix[i % len(mix)])

    before = ledger.fingerprint()
    naive_ops = max(12, NAIVE_BUDGET_GPUS // (nodes * GPUS_PER_NODE))
    row = Row(
        nodes=nodes,
        fill=1 - ledger.free_milli() / ledger.capacity_milli(),
        indexed_us=timed(INDEXED_OPS, indexed),
        decide_us=timed(INDEXED_OPS, decide),
        naive_us=timed(naive_ops, naive),
        naive_decide_us=timed(naive_ops, naive_decide),
        fresh_decide_us=timed(INDEXED_OPS, fresh_decide),
        fresh_naive_us=timed(naive_ops, fresh_naive),
    )
    assert ledger.fingerprint() == before  # place + release left the cluster as it was
    return row


def main() -> None:
    """Print ops/s and per-decision times for both paths, and the 10 000 / 100 node ratios."""
    print(f"best-fit place+release, {GPUS_PER_NODE} GPUs/node, product mix {'/'.join(MIX)}; best of {REPEATS}")
    print(f"{'':>13} | {'indexed (sorted free-capacity index)':^36} | {'naive (scan every GPU)':^36} |")
    print(f"{'nodes':>7} {'fill':>5} | {'ops/s':>9} {'decide us':>10} {'empty: us':>15} | {'ops/s':>9} "
          f"{'decide us':>10} {'empty: us':>15} | {'naive/indexed':>13}")
    rows = []
    for nodes in SIZES:
        row = measure(nodes)
        rows.append(row)
        print(f"{row.nodes:>7} {row.fill:>5.0%} | {1e6 / row.indexed_us:>9,.0f} {row.decide_us:>10.1f} "
              f"{row.fresh_decide_us:>15.1f} | {1e6 / row.naive_us:>9,.0f} {row.naive_decide_us:>10.1f} "
              f"{row.fresh_naive_us:>15.1f} | {row.naive_us / row.indexed_us:>12.1f}x", flush=True)
    print("ops/s: place + release at the given fill; decide: one BEST_FIT.choose; empty: a decision on a fresh cluster")
    small, large = rows[0], rows[-1]
    grow = large.decide_us / small.decide_us
    verdict = "meets" if grow <= 2 else "misses"
    print(f"per-decision time {large.nodes} / {small.nodes} nodes: indexed {grow:.2f}x ({verdict} the <= 2x goal), "
          f"naive {large.naive_decide_us / small.naive_decide_us:.1f}x")
    print(f"per-decision time on an empty cluster {large.nodes} / {small.nodes} nodes: "
          f"indexed {large.fresh_decide_us / small.fresh_decide_us:.2f}x, "
          f"naive {large.fresh_naive_us / small.fresh_naive_us:.1f}x")
    print(f"place+release time {large.nodes} / {small.nodes} nodes: "
          f"indexed {large.indexed_us / small.indexed_us:.2f}x, naive {large.naive_us / small.naive_us:.1f}x")

    bench_policies()


def bench_policies(nodes: int = 1_000) -> None:
    """Per policy: microseconds per node key and per full decision, on one partly filled cluster."""
    ledger = build(nodes)
    catalog = load_catalog()
    mix: Sequence[Request] = [catalog.request(name) for name in MIX]
    typical = FixedMix(TypicalMix.from_requests(mix))
    full = 1 - ledger.free_milli() / ledger.capacity_milli()
    print(f"\nevery policy on {nodes} nodes x {GPUS_PER_NODE} GPUs ({full:.0%} full), catalog mix; best of 3")
    print(f"{'policy':<15} {'key us':>8} {'decide ms':>10}")
    all_nodes = list(ledger.nodes.values())
    for name in POLICIES:
        policy = policy_for(name, typical)

        def key(i: int, policy: Policy = policy) -> None:
            policy.node_key(ledger, mix[i % len(mix)], all_nodes[i % len(all_nodes)])

        def decide(i: int, policy: Policy = policy) -> None:
            policy.choose(ledger, mix[i % len(mix)])

        print(f"{name:<15} {timed(3000, key):>8.1f} {timed(12, decide) / 1000:>10.2f}", flush=True)


if __name__ == "__main__":
    main()
